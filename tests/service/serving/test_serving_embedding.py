"""The embedding path without HTTP: the model's own pipeline by default, refusals before work."""

from __future__ import annotations

import numpy as np
import pytest

from service.serving.embedding import EmbeddingRequest, embed
from service.serving.failures import InvalidRequest, ModelNotFound
from tests.service.serving.conftest import InProcessClient, started
from tests.service.small_engines import HashEmbedder

pytestmark = pytest.mark.anyio


async def test_vectors_follow_the_models_pipeline_unless_asked() -> None:
    engine = HashEmbedder(name="serving-embed-pipeline", normalize=True)
    async with started(engine) as runtime:
        client = InProcessClient()
        default = await embed(runtime, client, EmbeddingRequest(["a b", "c"], "texts"))
        raw = await embed(runtime, InProcessClient(), EmbeddingRequest(["a b"], "texts", normalize=False))
    assert client.stages == ["embed"]
    assert default.model == engine.manifest.name
    assert [float(np.linalg.norm(e.vector)) for e in default.embeddings] == pytest.approx([1.0, 1.0])
    np.testing.assert_allclose(raw.embeddings[0].vector, engine.vector("a b"), rtol=1e-6)


async def test_a_truncated_text_costs_at_most_the_models_length() -> None:
    engine = HashEmbedder(name="serving-embed-truncate", max_len=4)
    long_text = "one two three four five six"
    async with started(engine) as runtime:
        done = await embed(runtime, InProcessClient(), EmbeddingRequest([long_text], "input"))
        assert done.embeddings[0].n_tokens == 4
        with pytest.raises(InvalidRequest) as refused:
            await embed(
                runtime, InProcessClient(), EmbeddingRequest(["a", long_text], "texts", truncate=False)
            )
    assert [(p["type"], p["loc"], p["ctx"]) for p in refused.value.problems] == [
        ("text_too_long", ("body", "texts", 1), {"limit": 4})
    ]


@pytest.mark.parametrize(
    ("asked", "refusal", "loc"),
    [
        (EmbeddingRequest(["a"], "input", model="text-embedding-3-small"), ModelNotFound, None),
        (EmbeddingRequest(["a"], "input", dimensions=9), InvalidRequest, ("body", "dimensions")),
        (EmbeddingRequest(["a"], "input", prompt_name="query"), InvalidRequest, ("body", "prompt_name")),
        (EmbeddingRequest([[1, 1000]], "input"), InvalidRequest, ("body", "input", 0, 1)),
        (EmbeddingRequest(["a"] * 9, "texts"), InvalidRequest, ("body", "texts")),
        (EmbeddingRequest(["a", "b" * 201], "texts"), InvalidRequest, ("body", "texts", 1)),
    ],
)
async def test_refusals_come_before_any_work(
    asked: EmbeddingRequest, refusal: type[Exception], loc: object
) -> None:
    engine = HashEmbedder(name="serving-embed-refusals")
    async with started(engine) as runtime:
        client = InProcessClient()
        with pytest.raises(refusal) as refused:
            await embed(runtime, client, asked)
    if isinstance(refused.value, InvalidRequest):
        assert [p["loc"] for p in refused.value.problems] == [loc]
    assert client.stages == [] and engine.hooks.batches == []
