"""POST /v1/embed: vectors, normalisation, truncation contract, limits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.service.api.conftest import Served, error_of, serving
from tests.service.small_engines import HashEmbedder, ReverseTranslator

pytestmark = pytest.mark.anyio


async def test_vectors_follow_the_model_pipeline(served: Served) -> None:
    texts = ["a man eats", "a woman reads a book"]
    r = await served.client.post("/v1/embed", json={"texts": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == served.embedder.manifest.name
    assert body["dim"] == 8
    assert body["n_tokens"] == [5, 7]
    assert body["usage"] == {"input_tokens": 12}
    for text, got in zip(texts, body["embeddings"], strict=True):
        expected = served.embedder.vector(text)
        expected /= np.linalg.norm(expected)  # the small model's manifest says normalize
        np.testing.assert_allclose(got, expected, rtol=1e-6)


async def test_normalize_false_returns_the_pooled_vector(served: Served) -> None:
    r = await served.client.post("/v1/embed", json={"texts": ["x y"], "normalize": False})
    np.testing.assert_allclose(r.json()["embeddings"][0], served.embedder.vector("x y"), rtol=1e-6)


async def test_long_texts_are_truncated_by_default(served: Served) -> None:
    long = " ".join(f"w{i}" for i in range(30))
    r = await served.client.post("/v1/embed", json={"texts": [long], "normalize": False})
    assert r.status_code == 200
    assert r.json()["n_tokens"] == [16]
    np.testing.assert_allclose(r.json()["embeddings"][0], served.embedder.vector(long), rtol=1e-6)


async def test_without_truncation_a_long_text_fails_the_request_naming_it(served: Served) -> None:
    long = " ".join(["w"] * 30)
    r = await served.client.post("/v1/embed", json={"texts": ["short", long], "truncate": False})
    assert r.status_code == 422
    error = error_of(r)
    assert [d["field"] for d in error["details"]] == ["texts[1]"]
    assert error["details"][0]["type"] == "text_too_long"
    assert error["details"][0]["limit"] == error["limit"] == 16  # the small embedder's max length


@pytest.mark.parametrize(
    "body, field",
    [
        ({"texts": []}, "texts"),
        ({"texts": "not a list"}, "texts"),
        ({"texts": ["ok", ""]}, "texts[1]"),
        ({"texts": ["\t"]}, "texts[0]"),
        ({"texts": ["x"] * 9}, "texts"),
        ({"texts": ["z" * 201]}, "texts[0]"),
        ({"texts": ["ok"], "normalize": "true"}, "normalize"),
        ({"texts": ["ok"], "truncate": 1}, "truncate"),
        ({"texts": ["ok"], "pooling": "cls"}, "pooling"),
        ({"texts": [None]}, "texts[0]"),
        ({"texts": ["ok"], "dimensions": 9}, "dimensions"),  # the small model has 8
        ({"texts": ["ok"], "dimensions": 0}, "dimensions"),
        ({"texts": ["ok"], "prompt_name": "query"}, "prompt_name"),  # the small model has no prompts
        ({"texts": [[1, 2]]}, "texts[0]"),  # token ids are /v1/embeddings' input
    ],
)
async def test_invalid_requests_are_422(served: Served, body: dict[str, Any], field: str) -> None:
    r = await served.client.post("/v1/embed", json=body)
    assert r.status_code == 422, r.text
    assert field in [d["field"] for d in error_of(r)["details"]]
    assert served.embedder.hooks.batches == []


async def test_the_default_prompt_goes_before_each_text_unless_another_is_named() -> None:
    """As sentence-transformers' encode: the model's default prompt when none is named."""
    prompts = {"query": "query: ", "passage": "passage: ", "none": ""}
    embedder = HashEmbedder(
        name="embed-prompts", prompts=prompts, default_prompt_name="query", normalize=False
    )
    async with serving(
        given={"embed": embedder, "translate": ReverseTranslator(name="embed-prompts-t")}
    ) as s:
        default = (await s.client.post("/v1/embed", json={"texts": ["a b"]})).json()
        named = (await s.client.post("/v1/embed", json={"texts": ["a b"], "prompt_name": "passage"})).json()
        empty = (await s.client.post("/v1/embed", json={"texts": ["a b"], "prompt_name": "none"})).json()
    np.testing.assert_allclose(default["embeddings"][0], embedder.vector("query: a b"), rtol=1e-6)
    np.testing.assert_allclose(named["embeddings"][0], embedder.vector("passage: a b"), rtol=1e-6)
    np.testing.assert_allclose(empty["embeddings"][0], embedder.vector("a b"), rtol=1e-6)
    assert default["n_tokens"] == [5]  # the prompt's tokens are the model's input too


async def test_dimensions_shorten_the_vectors(served: Served) -> None:
    r = await served.client.post("/v1/embed", json={"texts": ["x y"], "dimensions": 3, "normalize": False})
    assert r.status_code == 200, r.text
    assert r.json()["dim"] == 3
    np.testing.assert_allclose(r.json()["embeddings"][0], served.embedder.vector("x y")[:3], rtol=1e-6)
