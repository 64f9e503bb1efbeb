"""More tiny real artefacts of the engine tests (the base ones are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
