"""The rerank export on a tiny random BertForSequenceClassification (one label; no network, seconds):
the graph and the served engine against Hugging Face's AutoModelForSequenceClassification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from export import __main__ as cli
from export.rerank import export_rerank
from export.sources import cross_encoder
from export.verify import VerificationError
from export.verify.rerank import Tolerances, hugging_face_logits
from service.artefacts import load_and_verify, read_manifest
from service.engine.base import TextTooLong
from service.engine.loader import load_engine
from service.engine.reranker import OnnxReranker, RerankItem
from service.engine.session import SessionConfig, create_session
from tests.tiny_cross_encoder import MAX_LEN, tiny_cross_encoder_dir

QUERIES = ["what does the cat do?", "where is paris?"]
DOCUMENTS = [
    "a cat sleeps on the red ball.",
    "paris is the capital of france.",
    "the quick brown fox jumps over the lazy dog " * 6,  # beyond the pair's max length: cut
    "dogs",
    "the stock market fell.",
]


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_cross_encoder_dir(tmp_path_factory.mktemp("src") / "tiny-ce")


@pytest.fixture(scope="module")
def exported(tiny_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All three variants, exported once for the module; returns the out root."""
    out = tmp_path_factory.mktemp("artefacts")
    export_rerank(tiny_source, out, ["all"], name="tiny")
    return out


def _engine(directory: Path) -> OnnxReranker:
    engine = load_engine(directory, SessionConfig("cpu", 1, allow_spinning=False))
    assert isinstance(engine, OnnxReranker)
    return engine


def _served_logits(engine: OnnxReranker, pairs: list[tuple[str, str]]) -> np.ndarray:
    results = engine.rerank([RerankItem(q, d) for q, d in pairs])
    assert not [r for r in results if isinstance(r, Exception)]
    return np.array([r.logit for r in results if not isinstance(r, Exception)])


def test_layout_and_manifest(exported: Path) -> None:
    for variant in ("fp32", "int8", "fp16"):
        directory = exported / "tiny" / variant
        manifest = load_and_verify(directory)
        assert (manifest.task, manifest.variant, manifest.name) == ("rerank", variant, "tiny")
        assert manifest.rerank is not None and manifest.embedding is None
        assert manifest.rerank.model_dump() == {"max_len": MAX_LEN, "needs_token_type_ids": True}
        assert {f.path for f in manifest.files} == {"reranker.onnx", "tokenizer.json"}
        graph = manifest.graphs["reranker"]
        assert [(t.name, t.dtype) for t in graph.inputs] == [
            (n, "int64") for n in ("input_ids", "attention_mask", "token_type_ids")
        ]
        assert [(t.name, t.dtype, t.shape) for t in graph.outputs] == [("logits", "float32", ["batch", 1])]
        assert manifest.reference_check is not None
        assert not list((exported / "tiny").glob(".*")), "staging/work directories left behind"


def test_parity_figures_recorded(exported: Path) -> None:
    fp32 = read_manifest(exported / "tiny" / "fp32")
    assert fp32.parity["max_abs_logits"] <= 1e-4 and fp32.parity["misordered_vs_hf"] == 0
    assert fp32.reference_check is not None
    assert fp32.reference_check.figures["alone_vs_batched_max_abs_logits"] <= 1e-4
    int8 = read_manifest(exported / "tiny" / "int8")
    assert 0.99 <= int8.parity["pearson_vs_fp32"] < 1.0  # follows fp32, and really quantized
    assert int8.reference_check is not None
    assert int8.reference_check.bounds["min_pearson_vs_fp32"] == 0.99
    assert int8.reference_check.figures["pearson_vs_fp32"] >= 0.99
    fp16 = read_manifest(exported / "tiny" / "fp16")
    assert fp16.parity["pearson_vs_fp32"] >= 0.99
    assert fp16.fusions["Attention"] == 2


def test_graph_matches_hugging_face(exported: Path, tiny_source: Path) -> None:
    """The bare fp32 graph fed by Hugging Face's own tokenizer: logits within 1e-4."""
    from transformers import AutoTokenizer

    pairs = [(q, d) for q in QUERIES for d in DOCUMENTS]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_source))
    queries, documents = zip(*pairs, strict=True)
    feed = tokenizer(list(queries), list(documents), padding=True, truncation=True, return_tensors="np")
    session = create_session(exported / "tiny" / "fp32" / "reranker.onnx", SessionConfig("cpu", 1))
    (got,) = session.run(["logits"], {k: v.astype(np.int64) for k, v in feed.items()})
    expected = hugging_face_logits(cross_encoder.inspect_cross_encoder(tiny_source), pairs)
    np.testing.assert_allclose(got[:, 0], expected, atol=1e-4)


def test_served_engine_matches_hugging_face_and_its_ordering(exported: Path, tiny_source: Path) -> None:
    """The engine as the service runs it (its tokenizer copy, pair truncation, length-sorted
    sub-batches) against AutoModelForSequenceClassification: the logits, and every query's order."""
    engine = _engine(exported / "tiny" / "fp32")
    pairs = [(q, d) for q in QUERIES for d in DOCUMENTS]
    ours = _served_logits(engine, pairs)
    expected = hugging_face_logits(cross_encoder.inspect_cross_encoder(tiny_source), pairs)
    assert np.abs(ours - expected).max() <= 1e-4
    for got, want in zip(np.split(ours, len(QUERIES)), np.split(expected, len(QUERIES)), strict=True):
        assert np.ptp(want) > 1e-2  # random weights that tell documents apart
        assert list(np.argsort(-got)) == list(np.argsort(-want))


def test_long_pairs_are_cut_or_refused(exported: Path) -> None:
    engine = _engine(exported / "tiny" / "fp32")
    long = DOCUMENTS[2]
    (whole,) = engine.encode_pairs(QUERIES[0], [long])
    assert whole.n_tokens > MAX_LEN
    cut, refused = engine.rerank([RerankItem(QUERIES[0], long), RerankItem(QUERIES[0], long, truncate=False)])
    assert not isinstance(cut, Exception) and cut.n_tokens == MAX_LEN
    assert isinstance(refused, TextTooLong) and refused.limit == MAX_LEN


def test_second_run_is_up_to_date(
    exported: Path, tiny_source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.stat().st_mtime_ns for p in (exported / "tiny").rglob("*") if p.is_file()}
    argv = [
        str(tiny_source),
        "--out",
        str(exported),
        "--name",
        "tiny",
        "--variant",
        "fp32",
        "--variant",
        "int8",
    ]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "BertForSequenceClassification (a cross-encoder" in err
    assert "fp32: up to date" in err and "int8: up to date" in err
    assert {p: p.stat().st_mtime_ns for p in (exported / "tiny").rglob("*") if p.is_file()} == before


def test_cli_detects_a_cross_encoder_by_its_architecture(tiny_source: Path, tmp_path: Path) -> None:
    assert cli.detect_source(tiny_source).kind == "rerank"
    assert cli.CLASSIFIER_SUFFIX == cross_encoder.CLASSIFIER_SUFFIX
    plain = tmp_path / "plain"
    shutil.copytree(tiny_source, plain)
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps(config | {"architectures": ["BertModel"]}))
    assert cli.detect_source(plain).kind == "embedding"


def test_a_classifier_of_several_labels_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tiny_cross_encoder_dir(tmp_path / "nli", num_labels=3)
    with pytest.raises(ValueError, match="3 labels"):
        cross_encoder.inspect_cross_encoder(source)
    assert cli.main([str(source), "--out", str(tmp_path / "out")]) == 1
    assert "3 labels" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_out_of_tolerance_publishes_nothing(tiny_source: Path, tmp_path: Path) -> None:
    with pytest.raises(VerificationError, match="max-abs logits"):
        export_rerank(
            tiny_source, tmp_path, ["fp32"], name="tiny", tolerances=Tolerances(max_abs_logits=-1.0)
        )
    assert not list(tmp_path.rglob("manifest.json"))
    with pytest.raises(VerificationError, match="int8 out of tolerance: check pairs Pearson"):
        export_rerank(
            tiny_source,
            tmp_path,
            ["fp32", "int8"],
            name="tiny",
            tolerances=Tolerances(min_pearson_vs_fp32=1.01),
        )
    assert (tmp_path / "tiny" / "fp32" / "manifest.json").is_file()
    assert not (tmp_path / "tiny" / "int8").exists()


@pytest.mark.parametrize("model_type", ["xlm-roberta", "roberta", "distilbert", "mpnet"])
def test_other_supported_families(model_type: str, tmp_path: Path) -> None:
    """Every family the CLI accepts exports and verifies as a reranker (bge-reranker is XLM-R):
    no token type ids where the model has one segment type (tiny random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    source = tiny_cross_encoder_dir(tmp_path / model_type)
    vocab_size = json.loads((source / "config.json").read_text())["vocab_size"]
    for name in ("config.json", "model.safetensors"):
        (source / name).unlink()
    shape: dict[str, int] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    shape["intermediate_size"] = 64
    if model_type == "distilbert":
        shape = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}
    if model_type in ("roberta", "xlm-roberta"):
        shape |= {"bos_token_id": 2, "eos_token_id": 3, "type_vocab_size": 1}
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab_size, max_position_embeddings=66, pad_token_id=0, num_labels=1, **shape
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(source))
    assert cli.detect_source(source).kind == "rerank"
    (directory,) = export_rerank(source, tmp_path / "out", ["fp32"])
    manifest = load_and_verify(directory)
    assert manifest.rerank is not None and not manifest.rerank.needs_token_type_ids
    assert [t.name for t in manifest.graphs["reranker"].inputs] == ["input_ids", "attention_mask"]
    assert manifest.parity["max_abs_logits"] <= 1e-4
