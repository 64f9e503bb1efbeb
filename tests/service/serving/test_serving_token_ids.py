"""Token ids as input (OpenAI's, TEI's and vLLM's other form), on a tiny exported BERT: the ids a
text tokenizes to embed as the text does, cut at the model's length like the text, and over HTTP
through ``/v1/embeddings``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.engine.embedder import OnnxEmbedder
from service.engine.session import SessionConfig
from service.http.app import create_app
from service.serving.embedding import EmbeddingRequest, embed
from service.serving.failures import InvalidRequest
from tests.service.api.conftest import error_of, small_settings, until_ready
from tests.service.serving.conftest import InProcessClient, started

pytestmark = pytest.mark.anyio

TEXTS = ["a man rides a bike", "two dogs run on the big red street"]
LONG = " ".join(["the small cat sits on the street"] * 5)  # over the model's 16 tokens


@pytest.fixture(scope="module")
def artefact(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    pytest.importorskip("transformers")
    from export.embedding import export_embedding
    from tests.tiny_models import tiny_bert_dir

    source = tiny_bert_dir(tmp_path_factory.mktemp("sources") / "ids-bert")
    (directory,) = export_embedding(source, tmp_path_factory.mktemp("artefacts"), ["fp32"])
    yield directory


def engine(artefact: Path) -> OnnxEmbedder:
    return OnnxEmbedder(artefact, SessionConfig("cpu", 1))


async def test_a_texts_token_ids_embed_as_the_text_does_and_long_ones_are_cut_alike(artefact: Path) -> None:
    embedder = engine(artefact)
    ids = [e.ids for e in embedder.encode([*TEXTS, LONG])]
    assert len(ids[2]) > embedder.info.max_len
    async with started(embedder) as runtime:
        by_text = await embed(runtime, InProcessClient(), EmbeddingRequest([*TEXTS, LONG], "input"))
        by_ids = await embed(runtime, InProcessClient(), EmbeddingRequest(ids, "input"))
        with pytest.raises(InvalidRequest) as refused:
            await embed(runtime, InProcessClient(), EmbeddingRequest(ids, "input", truncate=False))
    for text, tokens in zip(by_text.embeddings, by_ids.embeddings, strict=True):
        np.testing.assert_allclose(tokens.vector, text.vector, atol=1e-6)
        assert tokens.n_tokens == text.n_tokens
    assert by_ids.embeddings[2].n_tokens == embedder.info.max_len
    assert [(p["type"], p["loc"]) for p in refused.value.problems] == [
        ("text_too_long", ("body", "input", 2))
    ]


async def test_token_ids_over_http_with_dimensions(artefact: Path) -> None:
    embedder = engine(artefact)
    ids = embedder.encode(TEXTS[:1])[0].ids
    app = create_app(small_settings(), {"embed": embedder})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await until_ready(client)
            one = await client.post("/v1/embeddings", json={"input": ids, "dimensions": 8})
            text = await client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": 8})
            beyond = await client.post(
                "/v1/embeddings", json={"input": [ids, [embedder.manifest.vocab_size]]}
            )
    assert one.status_code == 200, one.text
    assert one.json()["usage"]["prompt_tokens"] == len(ids)
    got = np.asarray(one.json()["data"][0]["embedding"])
    assert got.shape == (8,) and np.linalg.norm(got) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(got, text.json()["data"][0]["embedding"], atol=1e-6)
    assert beyond.status_code == 422 and error_of(beyond)["details"][0]["field"] == "input[1][0]"
