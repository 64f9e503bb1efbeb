"""Exporting again over earlier artefacts of the tiny reversal model (tests/export/conftest.py):
what is current is skipped, what is corrupted, of an earlier form or of other generation settings
is replaced, that variant only.

Every export here is measured on a few reference sentences (tests/tiny_models.py:
few_reference_sentences), the same in each so that what is current stays current: what these
tests check is what the export redoes, not the check on the committed sentences, which
test_translation_export.py covers (minutes of this machine for each int8 re-export otherwise).

An earlier int8 artefact is exported again once for the tests of all its marks (``re_exported``);
each test checks on a copy of its own that its mark alone makes the export redo that variant and
no other (the export's own decision, ``_to_export_again``), then what the re-export wrote.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from export.graphs.int8_rowwise import WEIGHT_MAX
from export.graphs.top_k_blocks import block_size
from export.graphs.translation_layout import SLOT_DECODER
from export.sources import GENERATION_CONFIG
from export.translation import export_translation
from service.artefacts import (
    BEAM_INDEX,
    INT8_WEIGHT_BITS,
    SENTENCE_ROWS,
    ArtefactError,
    Variant,
    decoder_layout_of,
    load_and_verify,
)
from service.serving.startup import is_stale
from tests.tiny_models import few_reference_sentences


@pytest.fixture(scope="module")
def checkpoint(reversal_checkpoint: Path) -> Path:
    return reversal_checkpoint


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return few_reference_sentences(tmp_path_factory.mktemp("reference") / "reference.txt")


@pytest.fixture(scope="module")
def exported(checkpoint: Path, reference: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The artefact root of the model's fp32 + int8 export; tests copy it before they change it."""
    out = tmp_path_factory.mktemp("exported") / "artefacts"
    export_translation(checkpoint, out, ["fp32", "int8"], reference=reference)
    return out


def test_rerun_skips_until_an_artefact_is_corrupted(
    checkpoint: Path, exported: Path, reference: Path, tmp_path: Path
) -> None:
    """Same weights: nothing is rebuilt. A corrupted decoder.onnx is named by load_and_verify, and
    the next export rebuilds that variant only."""
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    fp32, int8 = out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"
    before = {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)}
    export_translation(checkpoint, out, ["fp32", "int8"], reference=reference)
    assert {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)} == before

    data = bytearray((fp32 / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (fp32 / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match=r"decoder\.onnx"):
        load_and_verify(fp32)

    export_translation(checkpoint, out, ["fp32", "int8"], reference=reference)
    load_and_verify(fp32)
    assert (int8 / "manifest.json").stat().st_mtime_ns == before[int8]
    assert sorted(p.name for p in (out / "transformer-en-de").iterdir()) == ["fp32", "int8"]


def _older_layout(manifest: dict[str, Any]) -> None:
    manifest["translation"]["decoder_layout"] = "stacked_kv"


def _single_top_k(manifest: dict[str, Any]) -> None:
    manifest["translation"]["top_k_block"] = None


def _8_bit_weights(manifest: dict[str, Any]) -> None:
    del manifest["int8_weight_bits"]  # from before INT8_WEIGHT_BITS


def _memory_per_row(manifest: dict[str, Any]) -> None:
    decoder = manifest["graphs"]["decoder"]
    decoder["inputs"] = [t for t in decoder["inputs"] if t["name"] not in (SENTENCE_ROWS, BEAM_INDEX)]


# What an int8 manifest of an earlier export says, each reason enough for the next to replace it.
EARLIER_INT8: dict[str, Callable[[dict[str, Any]], None]] = {
    "older decoder layout": _older_layout,
    "single TopK": _single_top_k,
    "8-bit weights": _8_bit_weights,
    "memory per row": _memory_per_row,
}


def _as_if_earlier(exported: Path, out: Path, *marks: str) -> tuple[Path, Path]:
    """A copy of ``exported`` at ``out`` whose int8 manifest carries ``marks``: (fp32, int8)."""
    shutil.copytree(exported, out)
    fp32, int8 = out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"
    manifest = json.loads((int8 / "manifest.json").read_text())
    for mark in marks:
        EARLIER_INT8[mark](manifest)
    (int8 / "manifest.json").write_text(json.dumps(manifest))
    return fp32, int8


def _to_export_again(checkpoint: Path, out: Path, variants: list[str], reference: Path) -> list[str]:
    """The variants ``export_translation`` would export again at ``out``: its own decision
    (export/publish/variants.py: still_to_export), nothing built."""
    from export.publish.variants import still_to_export

    todo: list[str] = []

    def record(wanted: list[Variant], root: Path, up_to_date: Callable[[Variant], bool]) -> list[Variant]:
        todo.extend(still_to_export(wanted, root, up_to_date))
        return []

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("export.translation.still_to_export", record)
        export_translation(checkpoint, out, variants, reference=reference)
    return todo


@pytest.fixture(scope="module")
def re_exported(
    checkpoint: Path, exported: Path, reference: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, int]:
    """An artefact with every mark of EARLIER_INT8 on its int8 variant, exported again once for
    the tests of each mark (each tests that its mark alone makes the export redo int8, and no
    more): (fp32, int8, the fp32 manifest's mtime before the export)."""
    fp32, int8 = _as_if_earlier(exported, tmp_path_factory.mktemp("re-exported") / "a", *EARLIER_INT8)
    before = (fp32 / "manifest.json").stat().st_mtime_ns
    export_translation(checkpoint, fp32.parent.parent, ["fp32", "int8"], reference=reference)
    return fp32, int8, before


@pytest.mark.parametrize("mark", ["older decoder layout", "single TopK"])
def test_an_older_artefact_still_reads_and_is_re_exported(
    checkpoint: Path,
    exported: Path,
    reference: Path,
    re_exported: tuple[Path, Path, int],
    tmp_path: Path,
    mark: str,
) -> None:
    """An artefact of an earlier decoder layout (which the service refuses, naming the command
    that re-exports it), or from before the candidates by blocks (a single TopK, the same
    output), still reads and verifies, and the next export replaces it (that variant only)."""
    _, int8 = _as_if_earlier(exported, tmp_path / "artefacts", mark)
    assert load_and_verify(int8).translation is not None
    assert _to_export_again(checkpoint, tmp_path / "artefacts", ["fp32", "int8"], reference) == ["int8"]
    fp32, int8, before = re_exported
    assert (fp32 / "manifest.json").stat().st_mtime_ns == before
    rebuilt = load_and_verify(int8).translation
    assert rebuilt is not None and rebuilt.decoder_layout == SLOT_DECODER.layout
    assert rebuilt.top_k_block is not None and rebuilt.top_k_block == block_size(int8 / "decoder.onnx")


def test_an_int8_artefact_of_8_bit_weights_is_re_exported_with_7(
    checkpoint: Path, exported: Path, reference: Path, re_exported: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """int8 weights of 8 bits saturate onnxruntime's u8×s8 kernels on CPUs without VNNI: an
    artefact from before INT8_WEIGHT_BITS (no int8_weight_bits) is stale for the export and for the
    service's start, and the next export writes 7-bit weights (|w| ≤ 63 in every MatMul)."""
    assert (
        load_and_verify(exported / "transformer-en-de" / "int8").int8_weight_bits == INT8_WEIGHT_BITS
        and load_and_verify(exported / "transformer-en-de" / "fp32").int8_weight_bits is None
    )
    fp32, int8 = _as_if_earlier(exported, tmp_path / "artefacts", "8-bit weights")
    assert is_stale(int8) and not is_stale(fp32)
    assert _to_export_again(checkpoint, tmp_path / "artefacts", ["fp32", "int8"], reference) == ["int8"]
    fp32, int8, before = re_exported
    assert (fp32 / "manifest.json").stat().st_mtime_ns == before
    assert load_and_verify(int8).int8_weight_bits == INT8_WEIGHT_BITS and not is_stale(int8)
    graph = onnx.load(str(int8 / "decoder.onnx"))
    weights = [
        numpy_helper.to_array(t) for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8
    ]
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= WEIGHT_MAX


def test_a_slot_artefact_from_before_the_memory_per_sentence_is_refused_and_re_exported(
    checkpoint: Path, exported: Path, reference: Path, re_exported: tuple[Path, Path, int], tmp_path: Path
) -> None:
    """A slot decoder without sentence_rows / beam_index (memory per row) cannot be served: the
    service says to export again, and the next export does."""
    _, int8 = _as_if_earlier(exported, tmp_path / "artefacts", "memory per row")
    inputs = json.loads((int8 / "manifest.json").read_text())["graphs"]["decoder"]["inputs"]
    with pytest.raises(ArtefactError, match="export the model again"):
        decoder_layout_of(t["name"] for t in inputs)
    assert _to_export_again(checkpoint, tmp_path / "artefacts", ["int8"], reference) == ["int8"]
    rebuilt = load_and_verify(re_exported[1])
    assert {SENTENCE_ROWS, BEAM_INDEX} <= {t.name for t in rebuilt.graphs["decoder"].inputs}


def test_the_generation_configs_length_penalty_goes_into_the_manifest(
    checkpoint: Path, exported: Path, reference: Path, tmp_path: Path
) -> None:
    """generation_config.json beside the checkpoint sets the artefact's default length penalty;
    a changed one re-exports (the weights are the same), none means 1.0, a bad one is refused."""
    assert _length_penalty(exported / "transformer-en-de" / "fp32") == 1.0
    source = tmp_path / "transformer-en-de"
    shutil.copytree(checkpoint.parent if checkpoint.is_file() else checkpoint, source)
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    assert _to_export_again(source, out, ["fp32", "int8"], reference) == []  # a copy of the same checkpoint
    (source / GENERATION_CONFIG).write_text('{"length_penalty": 1.3, "num_beams": 4}')
    assert _to_export_again(source, out, ["fp32", "int8"], reference) == ["fp32", "int8"]
    (fp32,) = export_translation(source, out, ["fp32"], reference=reference)
    assert _length_penalty(fp32) == 1.3
    (source / GENERATION_CONFIG).write_text('{"length_penalty": 2.5}')
    with pytest.raises(ValueError, match=r"length_penalty must be a number in \[0, 2\]"):
        export_translation(source, out, ["fp32"], reference=reference)
    assert _length_penalty(fp32) == 1.3  # the earlier artefact is kept


def _length_penalty(directory: Path) -> float:
    info = load_and_verify(directory).translation
    assert info is not None
    return info.length_penalty
