"""A translation export whose graphs take ONNX's external data path, end to end.

NLLB-600M's graphs are over protobuf's 2 GiB; here the threshold (export/graphs/external_data.py's
EXTERNAL_DATA_THRESHOLD) is lowered to 0 so the tiny checkpoint's graphs are written as
``<graph>.onnx`` + ``<graph>.onnx.data``. The same checkpoint exported with the default threshold
(single files) is the comparison: the service must load the external-data artefact, verify every
data file's sha256, and serve the same tokens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from export.graphs import external_data
from export.graphs.shortlist import SHORTLIST_DECODER
from export.publish.translation import VMAP_FILE
from export.translation import export_translation, load_source
from export.verify.translation_checks import open_engine, translate_ids
from service.artefacts import ArtefactError, load_and_verify, read_manifest, write_manifest
from tests.tiny_models import identity_vmap, reversal_pairs

VARIANTS = ["fp32", "int8", "fp16"]
GRAPHS = ["decoder.onnx", "decoder_shortlist.onnx", "encoder.onnx"]
DATA_FILES = [f"{g}.data" for g in GRAPHS]


@pytest.fixture(scope="module")
def exports(
    reversal_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path, Path]:
    """(checkpoint, vmap, external-data root, single-file root) of the tiny model (the export
    tests' reversal checkpoint, tests/export/conftest.py, named tiny-en-de here), each exported
    fp32 + int8 + fp16 with a vocabulary map, measured on a few reference sentences."""
    root = tmp_path_factory.mktemp("external")
    checkpoint = Path(shutil.copytree(reversal_checkpoint, root / "tiny-en-de"))
    vmap = identity_vmap(checkpoint / "tokenizer.json", root / "identity.vmap")
    reference = root / "reference.txt"
    reference.write_text("\n".join(reversal_pairs(6)[0]) + "\n", encoding="utf-8")
    export_translation(checkpoint, root / "single", VARIANTS, reference=reference, vmap=vmap)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 0)
        export_translation(checkpoint, root / "external", VARIANTS, reference=reference, vmap=vmap)
    return checkpoint, reference, root / "external" / "tiny-en-de", root / "single" / "tiny-en-de"


def test_every_graph_has_its_data_file_listed(exports: tuple[Path, Path, Path, Path]) -> None:
    _, _, external, single = exports
    for variant, graphs, data in [
        ("fp32", GRAPHS, DATA_FILES),
        ("int8", GRAPHS, DATA_FILES),
        ("fp16", ["decoder.onnx", "encoder.onnx"], ["decoder.onnx.data", "encoder.onnx.data"]),
    ]:
        extra = [VMAP_FILE] if SHORTLIST_DECODER in graphs else []
        listed = sorted(f.path for f in load_and_verify(external / variant).files)
        assert listed == sorted([*graphs, *data, "tokenizer.json", *extra]), variant
        on_disk = sorted(p.name for p in (external / variant).iterdir())
        assert on_disk == sorted([*listed, "manifest.json"]), variant
        for name in data:
            assert (external / variant / name).stat().st_mode == (
                external / variant / "tokenizer.json"
            ).stat().st_mode
        single_listed = sorted(f.path for f in load_and_verify(single / variant).files)
        assert single_listed == sorted([*graphs, "tokenizer.json", *extra]), variant


def test_served_tokens_equal_the_single_file_exports(exports: tuple[Path, Path, Path, Path]) -> None:
    checkpoint, reference, external, single = exports
    source = load_source(checkpoint)
    texts = reference.read_text(encoding="utf-8").splitlines()
    for variant in ("fp32", "int8"):
        for shortlist in (False, True):
            got, want = (
                translate_ids(open_engine(d / variant, threads=1, shortlist=shortlist), source, texts, 2, 3)
                for d in (external, single)
            )
            assert got == want, (variant, shortlist)


def test_a_corrupted_data_file_is_refused_and_re_exported(
    exports: tuple[Path, Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-run skips the intact variants; a flipped byte in a data file (which the graph's own
    sha256 does not cover) fails the verification, and the next export rebuilds that variant."""
    checkpoint, reference, external, _ = exports
    root = tmp_path / "artefacts"
    shutil.copytree(external, root / "tiny-en-de")
    fp32, int8 = root / "tiny-en-de" / "fp32", root / "tiny-en-de" / "int8"
    vmap = tmp_path / "identity.vmap"
    identity_vmap(checkpoint / "tokenizer.json", vmap)
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 0)
    before = {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)}
    export_translation(checkpoint, root, ["fp32", "int8"], reference=reference, vmap=vmap)
    assert {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)} == before

    data = bytearray((int8 / "decoder.onnx.data").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (int8 / "decoder.onnx.data").write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match=r"decoder\.onnx\.data: sha256 does not match"):
        load_and_verify(int8)
    with pytest.raises(ArtefactError):
        open_engine(int8)

    export_translation(checkpoint, root, ["fp32", "int8"], reference=reference, vmap=vmap)
    load_and_verify(int8)
    assert (fp32 / "manifest.json").stat().st_mtime_ns == before[fp32]


def test_an_unlisted_data_file_is_refused(exports: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    """A data file beside a graph that the manifest does not list could be swapped unseen."""
    _, _, external, _ = exports
    directory = tmp_path / "fp32"
    shutil.copytree(external / "fp32", directory)
    manifest = read_manifest(directory)
    files = [f for f in manifest.files if f.path != "encoder.onnx.data"]
    write_manifest(directory, manifest.model_copy(update={"files": files}))
    with pytest.raises(ArtefactError, match=r"encoder\.onnx\.data: used but not listed"):
        load_and_verify(directory)
