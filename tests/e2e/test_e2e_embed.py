"""Embeddings over real HTTP against sentence-transformers' own ``encode`` of the same package
model: /v1/embed and /v1/embeddings (float and base64), fp32 to 1e-4 in cosine, int8 close."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.real_models import EMBEDDER, MINILM_DIR
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

DIM = 384
MAX_TOKENS = 256  # the model's max_seq_length: the long text below is truncated by both sides
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Ein Mann fährt Fahrrad; 自転車に乗る男性 🚲.",
    "ok",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MINILM_DIR), device="cpu")
    vectors: np.ndarray = model.encode(SENTENCES, convert_to_numpy=True)
    return vectors


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    dot = np.sum(got * want, axis=1)
    norms: np.ndarray = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return dot / norms


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_embed_matches_sentence_transformers(client: httpx.Client, reference: np.ndarray) -> None:
    body = post(client, "/v1/embed", {"texts": SENTENCES})
    assert body["model"] == EMBEDDER and body["dim"] == DIM
    vectors = np.array(body["embeddings"], dtype=np.float64)
    assert vectors.shape == (len(SENTENCES), DIM)
    similarity = cosines(vectors, reference)
    assert similarity.min() >= 0.9999, similarity
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # the model's pipeline
    assert body["n_tokens"][-1] == MAX_TOKENS and max(body["n_tokens"][:-1]) < MAX_TOKENS
    assert body["usage"]["input_tokens"] == sum(body["n_tokens"])


def test_embed_without_normalisation_keeps_the_direction(client: httpx.Client, reference: np.ndarray) -> None:
    body = post(client, "/v1/embed", {"texts": SENTENCES[:3], "normalize": False})
    vectors = np.array(body["embeddings"], dtype=np.float64)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert cosines(vectors, reference[:3]).min() >= 0.9999


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_embeddings_match_sentence_transformers(
    client: httpx.Client, reference: np.ndarray, encoding_format: str
) -> None:
    body = post(
        client,
        "/v1/embeddings",
        {"input": SENTENCES, "model": EMBEDDER, "encoding_format": encoding_format},
    )
    assert body["object"] == "list" and body["model"] == EMBEDDER
    assert [d["index"] for d in body["data"]] == list(range(len(SENTENCES)))
    if encoding_format == "base64":
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    else:
        rows = [np.array(d["embedding"]) for d in body["data"]]
    vectors = np.stack(rows).astype(np.float64)
    assert vectors.shape == (len(SENTENCES), DIM)
    assert cosines(vectors, reference).min() >= 0.9999
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_openai_embeddings_take_a_single_string(client: httpx.Client, reference: np.ndarray) -> None:
    body = post(client, "/v1/embeddings", {"input": SENTENCES[0]})
    (item,) = body["data"]
    assert cosines(np.array([item["embedding"]]), reference[:1])[0] >= 0.9999


def test_int8_embeddings_stay_close_to_sentence_transformers(
    int8_service: ServerProcess, reference: np.ndarray
) -> None:
    with httpx.Client(base_url=int8_service.url, timeout=120) as client:
        body = post(client, "/v1/embed", {"texts": SENTENCES})
    similarity = cosines(np.array(body["embeddings"], dtype=np.float64), reference)
    # The export's own int8 gate is a mean cosine ≥ 0.99 to fp32 (dynamic quantisation).
    assert similarity.mean() >= 0.98 and similarity.min() >= 0.95, similarity
