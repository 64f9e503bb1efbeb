"""OpenAI-compatible /v1/embeddings and /v1/models."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.service.api.conftest import Served, error_of, serving
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio


async def test_float_embeddings(served: Served) -> None:
    name = served.embedder.manifest.name
    r = await served.client.post(
        "/v1/embeddings", json={"input": ["a b", "c d e"], "model": name, "user": "u1"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == name
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert {d["object"] for d in body["data"]} == {"embedding"}
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    expected = served.embedder.vector("c d e")
    np.testing.assert_allclose(body["data"][1]["embedding"], expected / np.linalg.norm(expected), rtol=1e-6)


async def test_base64_decodes_to_the_float_vector(served: Served) -> None:
    floats = (await served.client.post("/v1/embeddings", json={"input": "hello world"})).json()
    packed = (
        await served.client.post("/v1/embeddings", json={"input": "hello world", "encoding_format": "base64"})
    ).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert decoded.shape == (8,)
    np.testing.assert_array_equal(decoded, np.asarray(floats["data"][0]["embedding"], dtype=np.float32))


async def test_a_single_string_gives_one_embedding(served: Served) -> None:
    body = (await served.client.post("/v1/embeddings", json={"input": "just one"})).json()
    assert len(body["data"]) == 1


async def test_an_unknown_model_is_404(served: Served) -> None:
    r = await served.client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
    assert r.status_code == 404
    assert error_of(r)["type"] == "model_not_found"


async def test_dimensions_shorten_and_renormalise_up_to_the_model_s(served: Served) -> None:
    """Matryoshka, as OpenAI's API and TEI: the first N dimensions, a unit vector again."""
    full = await served.client.post("/v1/embeddings", json={"input": "x y", "dimensions": 8})
    assert full.status_code == 200
    short = await served.client.post("/v1/embeddings", json={"input": "x y", "dimensions": 3})
    assert short.status_code == 200, short.text
    expected = served.embedder.vector("x y")[:3]
    np.testing.assert_allclose(
        short.json()["data"][0]["embedding"], expected / np.linalg.norm(expected), rtol=1e-6
    )
    np.testing.assert_allclose(
        full.json()["data"][0]["embedding"],
        served.embedder.vector("x y") / np.linalg.norm(served.embedder.vector("x y")),
        rtol=1e-6,
    )
    r = await served.client.post("/v1/embeddings", json={"input": "x", "dimensions": 9})
    assert r.status_code == 422
    error = error_of(r)
    assert error["details"][0]["field"] == "dimensions" and error["limit"] == 8
    assert error["details"][0]["type"] == "unsupported_dimensions"


async def test_token_ids_out_of_the_vocabulary_are_422_naming_the_id(served: Served) -> None:
    vocab = served.embedder.manifest.vocab_size
    r = await served.client.post("/v1/embeddings", json={"input": [[1, 2], [3, vocab, 4]]})
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert [(d["field"], d["type"]) for d in error["details"]] == [("input[1][1]", "token_id_out_of_range")]
    assert error["limit"] == vocab - 1
    assert served.embedder.hooks.batches == []


async def test_a_prompt_name_the_model_lacks_is_422_naming_its_prompts() -> None:
    embedder = HashEmbedder(name="openai-prompts", prompts={"query": "query: ", "passage": "passage: "})
    async with serving(
        given={"embed": embedder, "translate": ReverseTranslator(name="openai-prompts-t")}
    ) as s:
        asked = await s.client.post("/v1/embeddings", json={"input": "a b", "prompt_name": "passage"})
        refused = await s.client.post("/v1/embeddings", json={"input": "a b", "prompt_name": "document"})
        with_ids = await s.client.post("/v1/embeddings", json={"input": [2, 3], "prompt_name": "query"})
        cards = (await s.client.get("/v1/models")).json()["data"]
    card = next(c for c in cards if c["id"] == "openai-prompts")
    assert (
        card["prompts"] == {"query": "query: ", "passage": "passage: "} and "default_prompt_name" not in card
    )
    assert asked.status_code == 200, asked.text
    expected = embedder.vector("passage: a b")
    np.testing.assert_allclose(
        asked.json()["data"][0]["embedding"], expected / np.linalg.norm(expected), rtol=1e-6
    )
    assert refused.status_code == 422
    detail = error_of(refused)["details"][0]
    assert detail["field"] == "prompt_name" and detail["type"] == "unknown_prompt"
    assert "'document'" in detail["message"] and "passage, query" in detail["message"]
    assert with_ids.status_code == 422 and error_of(with_ids)["details"][0]["type"] == "prompt_with_token_ids"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"input": ""}, "input[0]"),
        ({"input": [1, -2, 3]}, "input[0][1]"),  # a token-id list: ids are not negative
        ({"input": [[1, 2], []]}, "input[1]"),
        ({"input": [[1, 2], "x"]}, "input[1]"),  # token ids and texts are not mixed
        ({"input": ["x", 3]}, "input[1]"),
        ({"input": [True]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": "x", "prompt_name": ""}, "prompt_name"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "m"}, "input"),
    ],
)
async def test_invalid_requests_are_422(served: Served, body: dict[str, object], field: str) -> None:
    r = await served.client.post("/v1/embeddings", json=body)
    assert r.status_code == 422, r.text
    assert field in [d["field"] for d in error_of(r)["details"]]


async def test_models_lists_both(served: Served) -> None:
    r = await served.client.get("/v1/models")
    assert r.status_code == 200
    cards = {card["task"]: card for card in r.json()["data"]}
    assert cards["embed"]["id"] == served.embedder.manifest.name and cards["embed"]["dim"] == 8
    assert cards["translate"]["source_languages"] == ["en"]
    assert cards["translate"]["target_languages"] == ["de"]
    assert {c["object"] for c in cards.values()} == {"model"}
    assert "trained_on" not in cards["translate"]  # its manifest does not say: no claim


async def test_models_say_what_each_was_trained_on() -> None:
    captions = "Multi30k: English descriptions of Flickr photos with German translations (image captions)"
    pairs = "datasets named by its model card: snli, multi_nli"
    given = [
        ReverseTranslator(name="said-translate", trained_on=captions),
        HashEmbedder(name="said-embed", trained_on=pairs),
    ]
    async with serving(given=given) as served:
        r = await served.client.get("/v1/models")
    assert r.status_code == 200
    assert {card["id"]: card["trained_on"] for card in r.json()["data"]} == {
        "said-translate": captions,
        "said-embed": pairs,
    }
