"""POST /v1/rerank (and TEI's /rerank) over a tiny exported cross-encoder: TEI's and Cohere's
shapes, scores against Hugging Face's model, the limits and errors embed has, the 404 without one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from export.sources.cross_encoder import inspect_cross_encoder
from export.verify.rerank import hugging_face_logits
from service.engine.reranker import OnnxReranker, Relevance, RerankItem, sigmoid
from service.engine.session import SessionConfig
from service.http.app import create_app
from tests.service.api.conftest import Served, engines, error_of, metric, serving, small_settings, until_ready
from tests.tiny_cross_encoder import tiny_rerank_artefact

pytestmark = pytest.mark.anyio

QUERY = "what does the cat do?"
TEXTS = [
    "paris is the capital of france.",
    "a cat sleeps on the red ball.",
    "the quick brown fox jumps over the lazy dog " * 4,  # cut at the pair's max length (32 tokens)
    "dogs",
    "the stock market fell.",
]


@pytest.fixture(scope="module")
def artefact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_rerank_artefact(tmp_path_factory.mktemp("rerank"))


@pytest.fixture(scope="module")
def hf_logits(artefact: Path) -> np.ndarray:
    source = inspect_cross_encoder(artefact.parents[1] / "sources" / "tiny-rerank")
    return hugging_face_logits(source, [(QUERY, t) for t in TEXTS])


@pytest.fixture
async def served(artefact: Path) -> AsyncIterator[Served]:
    reranker = OnnxReranker(artefact, SessionConfig("cpu", 1, allow_spinning=False))
    embedder, translator = engines()
    async with serving(given={"translate": translator, "embed": embedder, "rerank": reranker}) as s:
        yield s


async def test_tei_shape_ranks_by_sigmoid_of_the_model_s_logits(
    served: Served, hf_logits: np.ndarray
) -> None:
    r = await served.client.post("/v1/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 200, r.text
    ranks = r.json()
    assert [set(rank) for rank in ranks] == [{"index", "score"}] * len(TEXTS)
    expected = sigmoid(hf_logits)
    assert [rank["index"] for rank in ranks] == list(np.argsort(-expected))  # Hugging Face's order
    np.testing.assert_allclose([rank["score"] for rank in ranks], np.sort(expected)[::-1], atol=1e-4)


async def test_tei_options_raw_scores_and_text(served: Served, hf_logits: np.ndarray) -> None:
    body = {"query": QUERY, "texts": TEXTS, "raw_scores": True, "return_text": True, "truncate": True}
    ranks = (await served.client.post("/rerank", json=body)).json()  # TEI's own path
    assert [rank["text"] for rank in ranks] == [TEXTS[rank["index"]] for rank in ranks]
    np.testing.assert_allclose([rank["score"] for rank in ranks], np.sort(hf_logits)[::-1], atol=1e-4)


@pytest.mark.parametrize("raw_scores", [False, True])
async def test_scores_are_written_from_float32s_not_python_floats(
    served: Served, artefact: Path, raw_scores: bool
) -> None:
    """Each score is the float32 of the float64 one computed before (the logits' sigmoid, or the
    logits) and its text is what orjson writes for that float32: the shortest decimal that reads
    back as it. A score gone through a Python float is written with float64's digits
    (0.7310585975646973 for 0.7310586), which this body would not equal."""
    alone = OnnxReranker(artefact, SessionConfig("cpu", 1, allow_spinning=False))
    relevances = alone.rerank([RerankItem(QUERY, t) for t in TEXTS])
    logits = np.array([r.logit for r in relevances if isinstance(r, Relevance)], np.float64)
    assert len(logits) == len(TEXTS)
    expected = logits if raw_scores else sigmoid(logits)
    order = np.argsort(-expected, kind="stable").tolist()
    scores = expected[order].astype(np.float32)
    for field, score, shape in (("texts", "score", list), ("documents", "relevance_score", dict)):
        body = {"query": QUERY, field: TEXTS, "raw_scores": raw_scores}
        r = await served.client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        ranks = r.json() if shape is list else r.json()["results"]
        assert [rank["index"] for rank in ranks] == order
        written = [orjson.dumps(rank[score]) for rank in ranks]  # each as the body had it
        assert written == [orjson.dumps(s, option=orjson.OPT_SERIALIZE_NUMPY) for s in scores]
        assert f'"{score}":'.encode() + written[0] in r.content
        as_python_floats = [orjson.dumps(float(s)) for s in scores]
        assert written != as_python_floats  # these scores tell the two apart


async def test_cohere_shape(served: Served, hf_logits: np.ndarray) -> None:
    documents: list[Any] = [{"text": t} for t in TEXTS[:2]] + TEXTS[2:]  # v1's objects, v2's strings
    body = {
        "query": QUERY,
        "documents": documents,
        "top_n": 2,
        "return_documents": True,
        "model": "tiny-rerank",
    }
    r = await served.client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == {"id", "results", "meta"} and answer["id"] == r.headers["x-request-id"]
    best = list(np.argsort(-hf_logits)[:2])
    assert [result["index"] for result in answer["results"]] == best
    assert [result["document"] for result in answer["results"]] == [{"text": TEXTS[i]} for i in best]
    np.testing.assert_allclose(
        [result["relevance_score"] for result in answer["results"]], sigmoid(hf_logits[best]), atol=1e-4
    )
    assert answer["meta"]["tokens"]["input_tokens"] > 0
    plain = (await served.client.post("/v1/rerank", json={"query": QUERY, "documents": TEXTS})).json()
    assert [set(result) for result in plain["results"]] == [{"index", "relevance_score"}] * len(TEXTS)


async def test_pairs_go_through_the_model_s_queue_and_metrics(served: Served) -> None:
    before = metric("tserve_batch_size_sum", model="tiny-rerank")
    tokens = metric("tserve_input_tokens_total", model="tiny-rerank")
    r = await served.client.post("/v1/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 200
    assert metric("tserve_batch_size_sum", model="tiny-rerank") - before == len(TEXTS)  # one item per pair
    assert metric("tserve_input_tokens_total", model="tiny-rerank") > tokens
    assert metric("tserve_requests_total", endpoint="/v1/rerank", status="200") >= 1


async def test_without_truncation_a_long_pair_fails_naming_its_document(served: Served) -> None:
    for field in ("texts", "documents"):
        r = await served.client.post("/v1/rerank", json={"query": QUERY, field: TEXTS, "truncate": False})
        assert r.status_code == 422, r.text
        error = error_of(r)
        assert [d["field"] for d in error["details"]] == [f"{field}[2]"]
        assert error["details"][0]["type"] == "text_too_long" and error["limit"] == 32


@pytest.mark.parametrize(
    "body, field",
    [
        ({"query": QUERY}, "body"),
        ({"query": QUERY, "documents": None}, "body"),  # None has no length: a 422, not a 500
        ({"query": QUERY, "texts": ["a"], "documents": ["b"]}, "body"),
        ({"texts": ["a"]}, "query"),
        ({"query": " ", "texts": ["a"]}, "query"),
        ({"query": QUERY, "texts": []}, "texts"),
        ({"query": QUERY, "documents": ["ok", ""]}, "documents[1]"),
        ({"query": QUERY, "documents": [{"title": "x"}]}, "documents[0]"),
        ({"query": QUERY, "texts": ["x"] * 9}, "texts"),  # max_items_per_request 8
        ({"query": QUERY, "texts": ["z" * 201]}, "texts[0]"),  # max_chars_per_text 200
        ({"query": "z" * 201, "texts": ["a"]}, "query"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": QUERY, "texts": ["a"], "raw_scores": "true"}, "raw_scores"),
        ({"query": QUERY, "texts": ["a"], "truncation_direction": "Left"}, "truncation_direction"),
        ({"query": QUERY, "documents": ["a"], "rank_fields": ["text"]}, "rank_fields"),
    ],
)
async def test_invalid_requests_are_422(served: Served, body: dict[str, Any], field: str) -> None:
    r = await served.client.post("/v1/rerank", json=body)
    assert r.status_code == 422, r.text
    assert field in [d["field"] for d in error_of(r)["details"]]


async def test_another_model_name_is_404(served: Served) -> None:
    r = await served.client.post(
        "/v1/rerank", json={"query": QUERY, "documents": ["a"], "model": "rerank-v3.5"}
    )
    assert r.status_code == 404
    assert "tiny-rerank" in error_of(r)["message"]


async def test_the_reranker_is_among_the_models(served: Served) -> None:
    cards = {card["id"]: card for card in (await served.client.get("/v1/models")).json()["data"]}
    assert cards["tiny-rerank"]["task"] == "rerank" and cards["tiny-rerank"]["max_input_tokens"] == 32


async def test_without_a_reranker_rerank_is_404_saying_how_to_serve_one() -> None:
    async with serving() as s:
        r = await s.client.post("/v1/rerank", json={"query": QUERY, "texts": ["a"]})
    assert r.status_code == 404
    error = error_of(r)
    assert error["type"] == "model_not_found" and "TSERVE_RERANK_MODEL" in error["message"]


async def test_served_from_its_artefact_by_the_setting(artefact: Path) -> None:
    """TSERVE_RERANK_MODEL alone: the artefact under the root is loaded, verified and served."""
    settings = small_settings(
        artefact_root=artefact.parents[1], rerank_model="tiny-rerank", embed_model="", translate_model=""
    )
    settings = settings.model_copy(update={"variant": "fp32"})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await until_ready(client, timeout_s=30)
            r = await client.post("/rerank", json={"query": QUERY, "texts": TEXTS[:2]})
            assert r.status_code == 200 and len(r.json()) == 2
            assert (await client.post("/v1/embed", json={"texts": ["a"]})).status_code == 404


def test_a_reranker_on_cuda_cuts_its_batches_as_a_device_does(
    artefact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the embedder (tests/service/engine/test_embedder.py): the device's run cost on CUDA."""
    from service.cuda import CUDA
    from service.engine import reranker as reranker_module
    from service.engine.tokenizer import SubBatches

    limits = SubBatches(8, 512)
    assert OnnxReranker(artefact, SessionConfig("cpu", 1), limits).sub_batches == limits
    monkeypatch.setattr(reranker_module, "used_provider", lambda _: CUDA)
    on_cuda = OnnxReranker(artefact, SessionConfig("cpu", 1), limits)
    assert on_cuda.sub_batches == limits.on_device()
    # its runs padded to the device's shapes, each pair keeps the score the CPU gives it
    on_cpu = OnnxReranker(artefact, SessionConfig("cpu", 1), limits)
    rows: list[int] = []
    real_run = on_cuda.session.run
    monkeypatch.setattr(
        on_cuda.session,
        "run",
        lambda names, feeds: rows.append(len(feeds["input_ids"])) or real_run(names, feeds),
    )
    items = [RerankItem(QUERY, t) for t in TEXTS]
    for got, want in zip(on_cuda.rerank(items), on_cpu.rerank(items), strict=True):
        assert isinstance(got, Relevance) and isinstance(want, Relevance)
        assert got.logit == pytest.approx(want.logit, abs=1e-5) and got.n_tokens == want.n_tokens
    assert rows and all(n % 8 == 0 for n in rows)
