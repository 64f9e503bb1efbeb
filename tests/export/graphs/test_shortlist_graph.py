"""export/graphs/shortlist.py and ``--vmap``: the decoder step over vocabulary shortlists, exported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export import __main__ as cli
from export.graphs.shortlist import SHORTLIST_DECODER
from export.publish.translation import VMAP_FILE, up_to_date
from export.translation import load_source
from service.artefacts import (
    BEAM_INDEX,
    SENTENCE_ROWS,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    VOCABULARY,
    VOCABULARY_MASK,
    read_manifest,
    sha256_of_files,
)
from service.engine.translation.folding import fold_beams

ROWS = 5


@pytest.fixture(scope="module")
def exported(translation_checkpoint: Path, shortlist_export: Path) -> tuple[Path, Path, Path, Path]:
    """(checkpoint, vmap, artefact root, reference sentences) of the tiny model exported fp32 +
    int8 with ``--vmap`` (tests/conftest.py: the engine tests' shortlist artefact too)."""
    return (
        translation_checkpoint,
        shortlist_export / "identity.vmap",
        shortlist_export / "artefacts" / "tiny-en-de",
        shortlist_export / "reference.txt",
    )


def step_feeds(session: ort.InferenceSession, rows: int = ROWS, top_k: int = 6) -> dict[str, np.ndarray]:
    """Random but fixed inputs of one slot-layout decoder step, every row a sentence of its own."""
    rng = np.random.default_rng(0)
    sentence_rows, beam_index = fold_beams(np.arange(rows), np.arange(rows))
    feeds: dict[str, np.ndarray] = {SENTENCE_ROWS: sentence_rows, BEAM_INDEX: beam_index}
    for spec in session.get_inputs():
        name, shape = spec.name, spec.shape
        if name == "input_ids":
            feeds[name] = rng.integers(4, 40, (rows, 1))
        elif name == "source_mask":
            feeds[name] = np.ones((rows, 7), dtype=np.int64)
        elif name == "positions":
            feeds[name] = np.arange(rows, dtype=np.int64) % 4
        elif name == TOP_K:
            feeds[name] = np.array([top_k], dtype=np.int64)
        elif name.startswith(("memory_", "cache_")):
            length = 7 if name.startswith("memory_") else 6
            feeds[name] = rng.standard_normal((rows, shape[1], length, shape[3])).astype(np.float32)
    return feeds


def sessions(directory: Path) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return tuple(  # type: ignore[return-value]
        ort.InferenceSession(str(directory / f), options, providers=["CPUExecutionProvider"])
        for f in ("decoder.onnx", SHORTLIST_DECODER)
    )


def run_short(session: ort.InferenceSession, feeds: dict, vocabulary: np.ndarray, mask: np.ndarray) -> list:
    return session.run([TOP_LOG_PROBS, TOP_TOKENS], {**feeds, VOCABULARY: vocabulary, VOCABULARY_MASK: mask})


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_over_the_whole_vocabulary_the_step_gives_the_decoders_candidates(
    exported: tuple[Path, Path, Path, Path], variant: str
) -> None:
    decoder, short = sessions(exported[2] / variant)
    feeds = step_feeds(decoder)
    want_scores, want_tokens = decoder.run([TOP_LOG_PROBS, TOP_TOKENS], feeds)
    vocab = read_manifest(exported[2] / variant).vocab_size
    scores, tokens = run_short(short, feeds, np.arange(vocab), np.ones((ROWS, vocab), dtype=bool))
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)  # normalised in float64 there


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_row_gets_only_its_tokens_and_the_same_scores_whatever_the_union(
    exported: tuple[Path, Path, Path, Path], variant: str
) -> None:
    """Row r allows its own tokens; the union around them (more tokens, so other positions)
    changes neither which tokens it gets nor, to the bit, their scores."""
    _, short = sessions(exported[2] / variant)
    feeds = step_feeds(short)
    rng = np.random.default_rng(1)
    own = [np.sort(rng.choice(np.arange(3, 60), 8, replace=False)) for _ in range(ROWS)]
    found = []
    for extra in (np.zeros(0, dtype=np.int64), np.arange(3, 70)):
        union = np.unique(np.concatenate([*own, extra]))
        mask = np.zeros((ROWS, len(union)), dtype=bool)
        for r in range(ROWS):
            mask[r, np.searchsorted(union, own[r])] = True
        found.append(run_short(short, feeds, union, mask))
    (scores, tokens), (wider_scores, wider_tokens) = found
    for r in range(ROWS):
        assert set(tokens[r].tolist()) <= set(own[r].tolist())
    np.testing.assert_array_equal(wider_tokens, tokens)
    np.testing.assert_array_equal(wider_scores, scores)


def test_the_manifest_lists_the_shortlist_and_a_changed_map_exports_again(
    exported: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    checkpoint, vmap, root, _ = exported
    manifest = read_manifest(root / "int8")
    assert {f.path for f in manifest.files} >= {SHORTLIST_DECODER, VMAP_FILE}
    assert manifest.graphs["decoder_shortlist"].file == SHORTLIST_DECODER
    assert manifest.translation is not None and manifest.translation.vocabulary_map == VMAP_FILE
    assert (root / "int8" / VMAP_FILE).read_bytes() == vmap.read_bytes()
    assert manifest.parity["shortlist_whole_vocabulary_agreement_beam4"] == 1.0
    assert manifest.parity["shortlist_alone_vs_batched_identical_beam4"] == 1.0
    source = load_source(checkpoint)
    sha = sha256_of_files(source.weight_files)
    reference = manifest.reference_check
    assert reference is not None
    assert up_to_date(root / "int8", source, sha, "int8", reference.sha256, vmap)
    other = tmp_path / "other.vmap"
    other.write_text(vmap.read_text(encoding="utf-8") + "\tthe\n", encoding="utf-8")
    assert not up_to_date(root / "int8", source, sha, "int8", reference.sha256, other)
    assert not up_to_date(root / "int8", source, sha, "int8", reference.sha256, None)


def test_an_export_without_a_map_has_no_shortlist(translation_artefact: Path) -> None:
    """The same tiny model's export without ``--vmap`` (tests/conftest.py)."""
    directory = translation_artefact
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    assert "decoder_shortlist" not in manifest["graphs"]
    assert manifest["translation"]["vocabulary_map"] is None
    assert not (directory / SHORTLIST_DECODER).exists()


def test_the_command_line_takes_a_map_for_one_translation_source(
    exported: tuple[Path, Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--vmap`` with ``default`` or a missing file: exit 2 before anything is loaded; with a
    translation source it exports (here: already up to date, so nothing is redone)."""
    checkpoint, vmap, root, reference = exported
    assert cli.main(["default", "--vmap", str(vmap)]) == 2
    assert cli.main([str(checkpoint), "--vmap", str(tmp_path / "missing.vmap")]) == 2
    assert "--vmap" in capsys.readouterr().err
    before = (root / "int8" / "manifest.json").read_bytes()
    argv = [
        str(checkpoint),
        "--out",
        str(root.parent),
        "--variant",
        "int8",
        "--vmap",
        str(vmap),
        "--reference",
        str(reference),
        "--threads",
        "1",
    ]
    assert cli.main(argv) == 0
    assert (root / "int8" / "manifest.json").read_bytes() == before
