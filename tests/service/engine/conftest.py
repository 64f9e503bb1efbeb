"""Tiny real artefacts, exported once per test session by the export code itself."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def translation_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with model.safetensors + tokenizer.json of a tiny trained model of ours."""
    pytest.importorskip("torch")
    from tests.tiny_models import tiny_translation_checkpoint

    return tiny_translation_checkpoint(tmp_path_factory.mktemp("checkpoints") / "tiny-en-de")


@pytest.fixture(scope="session")
def translation_artefact(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-en-de/fp32, verified against PyTorch by export_translation."""
    from export.translation import export_translation

    (directory,) = export_translation(translation_checkpoint, tmp_path_factory.mktemp("artefacts"), ["fp32"])
    return directory


@pytest.fixture(scope="session")
def translation_fp16(translation_checkpoint: Path, translation_artefact: Path) -> Path:
    """The same model's fp16 variant (float16 memory and cache), next to the fp32 one."""
    from export.translation import export_translation

    (directory,) = export_translation(translation_checkpoint, translation_artefact.parent.parent, ["fp16"])
    return directory


@pytest.fixture(scope="session")
def embedding_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel in the sentence-transformers layout (mean pooling, max length 16)."""
    pytest.importorskip("transformers")
    from tests.tiny_models import tiny_bert_dir

    return tiny_bert_dir(tmp_path_factory.mktemp("sources") / "tiny-bert")


@pytest.fixture(scope="session")
def embedding_artefact(embedding_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-bert/fp32, written and verified by export_embedding."""
    from export.embedding import export_embedding

    (directory,) = export_embedding(embedding_source, tmp_path_factory.mktemp("artefacts"), ["fp32"])
    return directory


@pytest.fixture(scope="session")
def shortlist_artefact(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-en-de/int8 exported with a vocabulary map in which every word piece allows
    itself (right for a model that reverses its input)."""
    from tokenizers import Tokenizer

    from export.translation import export_translation

    root = tmp_path_factory.mktemp("shortlist")
    vocab = Tokenizer.from_file(str(translation_checkpoint / "tokenizer.json")).get_vocab()
    vmap = root / "identity.vmap"
    vmap.write_text("".join(f"{t}\t{t}\n" for t in sorted(vocab) if not t.startswith("<")), encoding="utf-8")
    (directory,) = export_translation(translation_checkpoint, root / "artefacts", ["int8"], vmap=vmap)
    return directory
