"""The same answer whatever the batch, on the tiny models: export.verify.determinism through the engines.

Every reference sentence (export/reference/sentences.en.txt, a few hundred) is translated alone
and inside mixed-length batches, greedy and beam 4, fp32 and per-row int8: identical tokens.
Embeddings alone vs batched: cosine ≥ 0.99999. The check can fail: the per-tensor int8 that
per-row int8 replaced (onnxruntime's dynamic quantisation) fails it on the translator, and an
engine that centres vectors on their batch fails the embedding one (the tiny random BERT's rows
have such similar ranges that per-tensor scales barely move with the batch there).
"""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

from export.graphs.onnx_tools import file_entries, graph_spec
from export.verify.determinism import (
    MIN_EMBED_COSINE,
    embedding_determinism,
    mixed_batches,
    translation_determinism,
)
from export.verify.reference_set import load_reference
from service.artefacts import read_manifest, write_manifest
from service.engine.base import Embedding, EmbedEngine, EmbedItem, TranslateEngine
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from service.engine.translation.translator import OnnxTranslator

SENTENCES = load_reference().sentences


@pytest.fixture(scope="module")
def translation_int8(
    translation_checkpoint: Path, translation_artefact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny translator's per-row int8 variant, next to its fp32 one. The export's own check
    runs on a few sentences: the tests here check every reference sentence themselves."""
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences

    reference = few_reference_sentences(tmp_path_factory.mktemp("reference") / "reference.txt")
    root = translation_artefact.parent.parent
    (directory,) = export_translation(translation_checkpoint, root, ["int8"], reference=reference)
    return directory


@pytest.fixture(scope="module")
def embedding_int8(embedding_source: Path, embedding_artefact: Path) -> Path:
    from export.embedding import export_embedding

    (directory,) = export_embedding(embedding_source, embedding_artefact.parent.parent, ["int8"])
    return directory


def _translator(directory: Path) -> TranslateEngine:
    engine = load_engine(directory, SessionConfig("cpu", 1, allow_spinning=False))
    assert isinstance(engine, OnnxTranslator)
    engine.truncate_source = True  # the tiny model takes 40 tokens; a few reference sentences are longer
    return engine


def _embedder(directory: Path) -> EmbedEngine:
    engine = load_engine(directory, SessionConfig("cpu", 1, allow_spinning=False))
    assert hasattr(engine, "embed")
    return engine  # type: ignore[return-value]


def per_tensor_int8(artefact: Path, out: Path, graphs: tuple[str, ...]) -> Path:
    """``artefact`` with its graphs quantised the old way (one activation scale per tensor)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    shutil.copytree(artefact, out)
    root = logging.getLogger()  # the quantizer logs its advice on the root logger
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in graphs:
                quantize_dynamic(
                    artefact / name,
                    out / name,
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
                )
    finally:
        root.setLevel(level)
    manifest = read_manifest(out)
    specs = {key: graph_spec(out, spec.file) for key, spec in manifest.graphs.items()}
    write_manifest(out, manifest.model_copy(update={"files": file_entries(out), "graphs": specs}))
    return out


def test_reference_set_is_a_few_hundred_distinct_sentences() -> None:
    assert len(SENTENCES) >= 200 and len(set(SENTENCES)) == len(SENTENCES)


def test_mixed_batches_cover_every_sentence_once_with_mixed_lengths() -> None:
    batches = mixed_batches(len(SENTENCES))
    assert sorted(i for b in batches for i in b) == list(range(len(SENTENCES)))
    assert {len(b) for b in batches[:-1]} == {32, 7, 16}
    lengths = [len(SENTENCES[i]) for i in batches[0]]
    assert max(lengths) >= 2 * min(lengths)  # short and long sentences share a batch


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_translations_alone_equal_batched(
    variant: str, translation_artefact: Path, translation_int8: Path
) -> None:
    directory = translation_artefact if variant == "fp32" else translation_int8
    report = translation_determinism(_translator(directory), SENTENCES)
    assert set(report.beams) == {1, 4}
    assert report.ok, report.describe(SENTENCES)
    assert report.figures() == {
        "alone_vs_batched_identical_beam1": 1.0,
        "alone_vs_batched_identical_beam4": 1.0,
    }
    for out in report.beams.values():  # not vacuous: real, varied outputs
        assert len({tuple(t) for t in out.batched}) > 20


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_embeddings_alone_equal_batched(variant: str, embedding_artefact: Path, embedding_int8: Path) -> None:
    directory = embedding_artefact if variant == "fp32" else embedding_int8
    report = embedding_determinism(_embedder(directory), SENTENCES)
    assert report.alone.shape == report.batched.shape == (len(SENTENCES), report.alone.shape[1])
    assert report.ok and report.min_cosine >= MIN_EMBED_COSINE


class BatchCentredEmbedder:
    """A real engine with a batch-level bug: vectors centred on their batch's mean (what a
    shared statistic does), so a text's vector depends on its neighbours."""

    def __init__(self, engine: EmbedEngine) -> None:
        self.engine = engine

    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        found = [r for r in self.engine.embed(items) if isinstance(r, Embedding)]
        mean = np.mean([r.vector for r in found], axis=0) if len(found) > 1 else 0.0
        return [Embedding(vector=r.vector - 0.1 * mean, n_tokens=r.n_tokens) for r in found]


def test_batch_dependent_embeddings_fail_the_check(embedding_artefact: Path) -> None:
    report = embedding_determinism(BatchCentredEmbedder(_embedder(embedding_artefact)), SENTENCES)
    assert not report.ok and report.min_cosine < MIN_EMBED_COSINE


def test_per_tensor_int8_translations_fail_the_check(translation_artefact: Path, tmp_path: Path) -> None:
    old = per_tensor_int8(
        translation_artefact, tmp_path / "int8-per-tensor", ("encoder.onnx", "decoder.onnx")
    )
    report = translation_determinism(_translator(old), SENTENCES, beam_sizes=(1,))
    assert not report.ok
    assert "beam 1:" in report.describe(SENTENCES)
