"""load_engine: dispatch on the manifest's task; unusable artefacts are ArtefactErrors naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.artefacts import ArtefactError, file_entry, read_manifest, write_manifest
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from service.engine.translation.translator import OnnxTranslator


@pytest.fixture
def translation_copy(translation_artefact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(translation_artefact, tmp_path / "fp32"))


def test_dispatches_on_the_task(translation_artefact: Path) -> None:
    engine = load_engine(translation_artefact, SessionConfig("cpu", 1))
    assert isinstance(engine, OnnxTranslator)
    assert engine.manifest.task == "translate" and engine.provider == "CPUExecutionProvider"


@pytest.mark.parametrize("name", ["decoder.onnx", "tokenizer.json"])
def test_a_corrupted_file_is_named(translation_copy: Path, name: str) -> None:
    path = translation_copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match=str(path)):
        load_engine(translation_copy, SessionConfig("cpu"))


def test_a_missing_file_or_manifest_is_named(translation_copy: Path, tmp_path: Path) -> None:
    (translation_copy / "encoder.onnx").unlink()
    with pytest.raises(ArtefactError, match=str(translation_copy / "encoder.onnx")):
        load_engine(translation_copy, SessionConfig("cpu"))
    (translation_copy / "manifest.json").unlink()
    with pytest.raises(ArtefactError, match=str(translation_copy / "manifest.json")):
        load_engine(translation_copy, SessionConfig("cpu"))
    with pytest.raises(ArtefactError, match=str(tmp_path / "nowhere")):
        load_engine(tmp_path / "nowhere")


def test_a_listed_but_unloadable_graph_is_named(translation_copy: Path) -> None:
    """Hashes match (the manifest was rewritten) but onnxruntime cannot parse the graph."""
    path = translation_copy / "decoder.onnx"
    path.write_bytes(b"\x08\x07garbage")
    manifest = read_manifest(translation_copy)
    files = [file_entry(translation_copy, f.path) for f in manifest.files]
    write_manifest(translation_copy, manifest.model_copy(update={"files": files}))
    with pytest.raises(ArtefactError, match=str(path)):
        load_engine(translation_copy, SessionConfig("cpu"))
