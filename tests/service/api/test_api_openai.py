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


async def test_dimensions_other_than_the_model_s_are_refused(served: Served) -> None:
    ok = await served.client.post("/v1/embeddings", json={"input": "x", "dimensions": 8})
    assert ok.status_code == 200
    r = await served.client.post("/v1/embeddings", json={"input": "x", "dimensions": 4})
    assert r.status_code == 422
    error = error_of(r)
    assert error["details"][0]["field"] == "dimensions" and error["limit"] == 8


@pytest.mark.parametrize(
    "body, field",
    [
        ({"input": ""}, "input[0]"),
        ({"input": [1, 2, 3]}, "input[0]"),  # token arrays are not supported
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
