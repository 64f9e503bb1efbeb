"""More tiny real artefacts of the engine tests (the base ones are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.background import built_once


@pytest.fixture(scope="session")
def shortlist_artefact(translation_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<root>/tiny-en-de/int8 exported with a vocabulary map in which every word piece allows
    itself (right for a model that reverses its input)."""
    from tokenizers import Tokenizer

    from export.translation import export_translation

    def export(root: Path) -> Path:
        vocab = Tokenizer.from_file(str(translation_checkpoint / "tokenizer.json")).get_vocab()
        vmap = root / "identity.vmap"
        lines = [f"{t}\t{t}\n" for t in sorted(vocab) if not t.startswith("<")]
        vmap.write_text("".join(lines), encoding="utf-8")
        (directory,) = export_translation(translation_checkpoint, root / "artefacts", ["int8"], vmap=vmap)
        return directory

    return built_once(tmp_path_factory, "shortlist-int8", export)
