"""POST /v1/embed: vectors, normalisation, truncation contract, limits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.service.api.conftest import Served, error_of

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
    ],
)
async def test_invalid_requests_are_422(served: Served, body: dict[str, Any], field: str) -> None:
    r = await served.client.post("/v1/embed", json=body)
    assert r.status_code == 422, r.text
    assert field in [d["field"] for d in error_of(r)["details"]]
    assert served.embedder.hooks.batches == []
