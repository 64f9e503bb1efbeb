"""Each embedding model's own options, exported and served, against sentence-transformers on a
tiny random BERT: mean, cls and last-token pooling, and the prompts of
config_sentence_transformers.json (the default one applied when none is named)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

from export.embedding import export_embedding
from export.sources import bert
from service.artefacts import MANIFEST_NAME, read_manifest
from service.engine.base import Embedding, EmbedItem
from service.engine.embedder import OnnxEmbedder
from service.engine.pooling import l2_normalize
from tests.export.test_embedding_export import make_tiny_st_model

PROMPTS = {"query": "query: ", "passage": "passage: ", "plain": ""}
TEXTS = [
    "A man is playing a guitar.",
    "dogs",
    "Two dogs are running through a snowy field, chasing a red ball.",
    "the quick brown fox " * 20,  # over max_seq_length with the prompt: truncated alike
]


def with_options(directory: Path, pooling: str, default_prompt_name: str | None = "query") -> Path:
    """The tiny sentence-transformers model with ``pooling`` (older key form for mean/cls, the
    newer ``pooling_mode`` for lasttoken) and the prompts, ``default_prompt_name`` the default."""
    make_tiny_st_model(directory, pooling="mean" if pooling == "lasttoken" else pooling)
    if pooling == "lasttoken":
        config = {"word_embedding_dimension": 32, "pooling_mode": "lasttoken", "include_prompt": True}
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    st_config = {
        "prompts": PROMPTS,
        "default_prompt_name": default_prompt_name,
        "similarity_fn_name": "cosine",
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st_config), encoding="utf-8")
    return directory


def _vectors(engine: OnnxEmbedder, texts: list[str], prompt: str) -> np.ndarray:
    results = engine.embed([EmbedItem(prompt + t, normalize=True) for t in texts])
    assert all(isinstance(r, Embedding) for r in results), results
    return np.stack([r.vector for r in results if isinstance(r, Embedding)])


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_served_vectors_equal_sentence_transformers_with_each_prompt(pooling: str, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    source = with_options(tmp_path / f"{pooling}-bert", pooling)
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    manifest = read_manifest(directory)
    assert manifest.embedding is not None
    assert manifest.embedding.pooling == pooling
    assert (manifest.embedding.prompts, manifest.embedding.default_prompt_name) == (PROMPTS, "query")
    assert manifest.parity["min_cosine_vs_st"] >= 0.9999  # the export's own check, default prompt applied
    engine = OnnxEmbedder(directory)
    reference = SentenceTransformer(str(source), device="cpu")
    for prompt_name in (None, "query", "passage", "plain"):
        expected = reference.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
        got = _vectors(engine, TEXTS, manifest.embedding.prompt(prompt_name))
        cosines = (got * l2_normalize(expected)).sum(axis=1)
        assert cosines.min() >= 0.9999, (pooling, prompt_name, cosines)
    # the prompts change the vectors: a test that would pass without them would prove nothing
    assert not np.allclose(_vectors(engine, TEXTS[:1], "query: "), _vectors(engine, TEXTS[:1], "passage: "))


def test_last_token_pooling_reads_the_last_real_token_of_right_padded_rows(tmp_path: Path) -> None:
    """Short and long texts in one sub-batch: each vector equals the text's alone (padding never read)."""
    source = with_options(tmp_path / "last", "lasttoken", default_prompt_name=None)
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    engine = OnnxEmbedder(directory)
    together = _vectors(engine, TEXTS, "")
    alone = np.concatenate([_vectors(engine, [t], "") for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_a_model_without_prompts_and_old_manifests_have_none(tmp_path: Path) -> None:
    source = make_tiny_st_model(tmp_path / "plain-bert")
    info = bert.inspect_source(source).info()
    assert (info.prompts, info.default_prompt_name, info.prompt(None)) == ({}, None, "")
    with pytest.raises(KeyError):
        info.prompt("query")
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    written = json.loads((directory / MANIFEST_NAME).read_text())
    for field in ("prompts", "default_prompt_name"):
        del written["embedding"][field]  # as written before the fields existed
    (directory / MANIFEST_NAME).write_text(json.dumps(written), encoding="utf-8")
    embedding = read_manifest(directory).embedding
    assert embedding is not None and embedding.prompts == {} and embedding.default_prompt_name is None


@pytest.mark.parametrize(
    ("pooling_config", "message"),
    [
        ({"pooling_mode": "max"}, "max"),
        ({"pooling_mode": ["mean", "cls"]}, "mean"),
        ({"pooling_mode": "lasttoken", "include_prompt": False}, "include_prompt"),
    ],
)
def test_unsupported_pooling_configs_are_refused(
    pooling_config: dict[str, object], message: str, tmp_path: Path
) -> None:
    source = make_tiny_st_model(tmp_path / "bert")
    (source / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        bert.inspect_source(source)


def test_a_default_prompt_that_is_not_a_prompt_is_refused(tmp_path: Path) -> None:
    source = make_tiny_st_model(tmp_path / "bert")
    config = {"prompts": {"query": "query: "}, "default_prompt_name": "passage"}
    (source / "config_sentence_transformers.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="passage"):
        bert.inspect_source(source)


def test_changed_prompts_export_the_model_again(tmp_path: Path) -> None:
    source = with_options(tmp_path / "bert", "mean")
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    before = (directory / MANIFEST_NAME).stat().st_mtime_ns
    config = {"prompts": {"query": "search_query: "}, "default_prompt_name": "query"}
    (source / "config_sentence_transformers.json").write_text(json.dumps(config), encoding="utf-8")
    (again,) = export_embedding(source, tmp_path / "out", ["fp32"])
    assert (again / MANIFEST_NAME).stat().st_mtime_ns != before
    manifest = read_manifest(again)
    assert manifest.embedding is not None and manifest.embedding.prompt(None) == "search_query: "
