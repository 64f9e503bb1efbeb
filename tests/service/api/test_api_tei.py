"""TEI's API (/embed, /, /similarity, /tokenize, /decode, /info): its shapes, defaults and errors,
the vectors /v1/embed's; and huggingface_hub's InferenceClient against a live server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.servers import ServerProcess, artefact_env, server_process, service_command, small_server_command
from tests.service.api.conftest import Served, serving, small_settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator
from tests.tiny_bert import write_wordpiece_tokenizer

pytestmark = pytest.mark.anyio


def tei_error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    message: str = body["error"]
    return message


def with_tokenizer(root: Path, model: str) -> None:
    """A WordPiece tokenizer where the small embedder's artefact would be, its specials marked
    special as a published BERT's are."""
    from tokenizers import Tokenizer

    directory = root / model / "fp32"
    directory.mkdir(parents=True)
    write_wordpiece_tokenizer(directory, ["a", "cat", "dog"], ["##s"], model_max_length=16, truncation=16)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.save(str(directory / "tokenizer.json"))


async def test_embed_gives_v1_embeds_vectors(served: Served) -> None:
    texts = ["a man eats", "a woman reads a book"]
    mine = (await served.client.post("/v1/embed", json={"texts": texts, "normalize": True})).json()
    r = await served.client.post("/embed", json={"inputs": texts})  # normalize: TEI's default, true
    assert r.status_code == 200, r.text
    assert np.array(r.json()).shape == (2, 8)
    np.testing.assert_allclose(r.json(), mine["embeddings"], rtol=1e-6)
    one = await served.client.post("/embed", json={"inputs": "a man eats", "normalize": False})
    np.testing.assert_allclose(one.json(), [served.embedder.vector("a man eats")], rtol=1e-6)


async def test_root_embeds_ranks_or_compares_as_the_body_asks(served: Served) -> None:
    embedded = await served.client.post("/", json={"inputs": ["a b", "c"]})
    assert embedded.status_code == 200 and len(embedded.json()) == 2
    compared = await served.client.post(
        "/", json={"inputs": {"source_sentence": "a b", "sentences": ["a b", "x"]}}
    )
    assert compared.status_code == 200, compared.text
    assert compared.json()[0] == pytest.approx(1.0) and compared.json()[1] < 1
    ranked = await served.client.post("/", json={"query": "a", "texts": ["b"]})
    assert tei_error(ranked, 404, "validation").startswith("no rerank model")


async def test_similarity_is_the_cosine_of_the_vectors(served: Served) -> None:
    body = {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "two cats run"]}, "parameters": {}}
    r = await served.client.post("/similarity", json=body)
    source = served.embedder.vector("a cat")
    for got, text in zip(r.json(), ["a dog", "two cats run"], strict=True):
        other = served.embedder.vector(text)
        assert got == pytest.approx(source @ other / np.linalg.norm(source) / np.linalg.norm(other), rel=1e-5)


@pytest.mark.parametrize(
    "path, body, status, error_type",
    [
        ("/embed", {"inputs": []}, 400, "empty"),
        ("/embed", {"inputs": ["a"] * 9}, 422, "validation"),  # small_settings: 8 texts a request
        ("/embed", {"inputs": ["x " * 30], "truncate": False}, 422, "validation"),
        ("/embed", {"inputs": "a", "truncation_direction": "Left"}, 422, "validation"),
        ("/embed", {"inputs": "a", "dimensions": 9}, 422, "validation"),
        ("/embed", {"inputs": 3}, 422, "validation"),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400, "empty"),
        ("/tokenize", {"inputs": ""}, 422, "validation"),
        ("/decode", {"ids": "a"}, 422, "validation"),
    ],
)
async def test_bad_input_is_answered_in_teis_shape(
    served: Served, path: str, body: dict[str, Any], status: int, error_type: str
) -> None:
    assert tei_error(await served.client.post(path, json=body), status, error_type)


async def test_unknown_fields_are_ignored_as_tei_ignores_them(served: Served) -> None:
    r = await served.client.post("/embed", json={"inputs": "a", "parameters": {}, "something": 1})
    assert r.status_code == 200, r.text


async def test_body_faults_and_keys_are_answered_in_teis_shape() -> None:
    async with serving(small_settings(api_keys=["k1"], max_body_bytes=1024)) as served:
        assert tei_error(await served.client.post("/embed", json={"inputs": "a"}), 401, "validation")
        key = {"Authorization": "Bearer k1"}
        assert (await served.client.post("/embed", json={"inputs": "a"}, headers=key)).status_code == 200
        big = await served.client.post("/embed", json={"inputs": "w " * 600}, headers=key)
        assert "larger than 1024 bytes" in tei_error(big, 413, "validation")
        bad = await served.client.post(
            "/embed", content=b"{", headers={**key, "Content-Type": "application/json"}
        )
        assert "not valid JSON" in tei_error(bad, 422, "validation")


async def test_tokenize_and_decode_with_the_artefacts_tokenizer(tmp_path: Path) -> None:
    embedder = HashEmbedder(name="tei-tokens")
    with_tokenizer(tmp_path, embedder.manifest.name)
    settings = small_settings(artefact_root=tmp_path)
    async with serving(settings, {"embed": embedder, "translate": ReverseTranslator()}) as served:
        r = await served.client.post("/tokenize", json={"inputs": "a cats"})
        assert r.status_code == 200, r.text
        assert r.json() == [
            [
                {"id": 2, "text": "[CLS]", "special": True, "start": None, "stop": None},
                {"id": 5, "text": "a", "special": False, "start": 0, "stop": 1},
                {"id": 6, "text": "cat", "special": False, "start": 2, "stop": 5},
                {"id": 8, "text": "s", "special": False, "start": 5, "stop": 6},
                {"id": 3, "text": "[SEP]", "special": True, "start": None, "stop": None},
            ]
        ]
        bare = await served.client.post("/tokenize", json={"inputs": ["a"], "add_special_tokens": False})
        assert [t["id"] for t in bare.json()[0]] == [5]
        decoded = await served.client.post("/decode", json={"ids": [2, 5, 6, 8, 3]})
        assert decoded.json() == ["a cats"]
        kept = await served.client.post("/decode", json={"ids": [[2, 5]], "skip_special_tokens": False})
        assert kept.json() == ["[CLS] a"]
        outside = await served.client.post("/decode", json={"ids": [[10_000]]})
        assert "outside the vocabulary" in tei_error(outside, 422, "validation")


async def test_tokenize_without_an_artefact_is_404(served: Served) -> None:
    assert tei_error(await served.client.post("/tokenize", json={"inputs": "a"}), 404, "validation")


async def test_info_describes_the_served_model(served: Served) -> None:
    info = (await served.client.get("/info")).json()
    assert info["model_id"] == served.embedder.manifest.name
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 16 and info["max_client_batch_size"] == 8
    assert info["model_dtype"] == "float32" and info["auto_truncate"] is True


def test_huggingface_hub_inference_client_against_a_live_server(tmp_path: Path) -> None:
    """``InferenceClient(model=BASE)`` (TEI's root) and ``model=BASE/embed``; vectors as /v1/embed's."""
    from huggingface_hub import InferenceClient

    env = {"TSERVE_API_KEYS": '["k1"]', "TSERVE_MAX_WAIT_MS": "1"}
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        texts = ["a man eats food", "a woman reads"]
        mine = httpx.post(
            f"{server.url}/v1/embed",
            json={"texts": texts, "normalize": True},
            headers={"Authorization": "Bearer k1"},
        ).json()["embeddings"]
        for model in (server.url, f"{server.url}/embed"):
            client = InferenceClient(model=model, token="k1")
            got = client.feature_extraction(texts[0])
            assert got.shape == (1, 8)
            cosine = float(got[0] @ np.array(mine[0]) / np.linalg.norm(got[0]) / np.linalg.norm(mine[0]))
            assert cosine >= 0.999999
        scores = InferenceClient(model=server.url, token="k1").sentence_similarity(
            texts[0], [texts[0], texts[1]]
        )
        assert scores[0] == pytest.approx(1.0) and scores[1] < 1


@pytest.fixture(scope="module")
def embedder_and_reranker(
    embedding_artefact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``python -m service`` serving a tiny exported embedder and a tiny exported cross-encoder
    together (no translation model), with a key."""
    from tests.tiny_cross_encoder import tiny_rerank_artefact

    reranker = tiny_rerank_artefact(tmp_path_factory.mktemp("rerank"))
    root = tmp_path_factory.mktemp("served")
    for artefact in (embedding_artefact, reranker):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    env = artefact_env(root) | {
        "TSERVE_TRANSLATE_MODEL": "",
        "TSERVE_RERANK_MODEL": reranker.parent.name,
        "TSERVE_API_KEYS": '["k1"]',
        "TSERVE_MAX_WAIT_MS": "1",
        "TSERVE_MAX_ITEMS_PER_REQUEST": "8",
    }
    with server_process(service_command(), env, root / "server.log") as server:
        yield server


def test_root_dispatches_by_the_body_with_a_reranker_served_too(embedder_and_reranker: ServerProcess) -> None:
    """TEI's root answers as TEI serving each model would: ``inputs`` embeds (huggingface_hub's
    ``feature_extraction``) or compares (``sentence_similarity``); ``query`` and ``texts`` rank
    (huggingface_hub has no ranking call: plain HTTP), each as its own route answers."""
    from huggingface_hub import InferenceClient

    url, key = embedder_and_reranker.url, {"Authorization": "Bearer k1"}
    client = InferenceClient(model=url, token="k1")
    texts = ["a cat sleeps on the red ball", "the stock market fell"]
    embedded = httpx.post(f"{url}/embed", json={"inputs": texts[0]}, headers=key).json()
    np.testing.assert_allclose(client.feature_extraction(texts[0]), embedded, rtol=1e-6)
    compared = httpx.post(
        f"{url}/similarity", json={"inputs": {"source_sentence": "a cat", "sentences": texts}}, headers=key
    ).json()
    assert client.sentence_similarity("a cat", texts) == pytest.approx(compared, rel=1e-6)

    body = {"query": "what does the cat do?", "texts": texts, "return_text": True}
    ranked = httpx.post(f"{url}/", json=body, headers=key)
    assert ranked.status_code == 200, ranked.text
    assert ranked.json() == httpx.post(f"{url}/rerank", json=body, headers=key).json()
    assert sorted(rank["index"] for rank in ranked.json()) == [0, 1]
    assert [rank["text"] for rank in ranked.json()] == [texts[rank["index"]] for rank in ranked.json()]


@pytest.mark.parametrize(
    "body, status, error_type",
    [
        ({"query": "a cat", "texts": []}, 400, "empty"),
        ({"query": "a cat", "texts": ["b"], "raw_scores": "yes"}, 422, "validation"),
        ({"query": "a cat", "texts": ["b"], "truncation_direction": "Left"}, 422, "validation"),
        ({"query": "a cat", "texts": ["b"] * 9}, 422, "validation"),  # TSERVE_MAX_ITEMS_PER_REQUEST
    ],
)
def test_a_bad_rank_at_the_root_is_answered_in_teis_shape(
    embedder_and_reranker: ServerProcess, body: dict[str, Any], status: int, error_type: str
) -> None:
    r = httpx.post(f"{embedder_and_reranker.url}/", json=body, headers={"Authorization": "Bearer k1"})
    assert tei_error(r, status, error_type)
