"""Shared test settings: one CPU thread for torch (the machine is shared with training runs); the
tiny real artefacts that tests across the tree use, each trained or exported once per session
by the export code itself (a fixture imported into a module would be a second one, built again);
and the default models' artefacts of the e2e and image tests, their export started as soon as
collection ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.e2e.real_models import DefaultArtefacts

DEFAULT_ARTEFACTS = "default_artefacts"
_default_export: list[DefaultArtefacts] = []  # the session's, once started


def pytest_collection_finish(session: pytest.Session) -> None:
    """The default models' export, when a selected test serves them: started now, beside the
    tests before it (minutes on a clean clone), where pytest's cache keeps it between runs."""
    cache = getattr(session.config, "cache", None)  # absent under -p no:cacheprovider
    if session.config.option.collectonly or cache is None or _default_export:
        return
    if any(DEFAULT_ARTEFACTS in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.e2e.real_models import DefaultArtefacts

        _default_export.append(DefaultArtefacts(cache.mkdir("e2e-artefacts")))


def pytest_sessionfinish() -> None:
    for export in _default_export:
        export.stop()


@pytest.fixture(scope="session")
def default_artefacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """fp32 and int8 of the default models (tests/e2e/real_models.py), exported once."""
    if not _default_export:
        from tests.e2e.real_models import DefaultArtefacts

        _default_export.append(DefaultArtefacts(tmp_path_factory.mktemp("e2e-artefacts")))
    yield _default_export[0].result()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Keep torch on one thread; the service tests run without torch installed."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


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
def translation_fp16(translation_checkpoint: Path, translation_artefact: Path) -> Path:
    """The same model's fp16 variant (float16 memory and cache), next to the fp32 one."""
    from export.translation import export_translation

    (directory,) = export_translation(translation_checkpoint, translation_artefact.parent.parent, ["fp16"])
    return directory
