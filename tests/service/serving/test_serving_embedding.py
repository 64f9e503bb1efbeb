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


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("inputs", [["a b", "x" * 60, "c"], ["a b", [101, 7, 8, 102], "x" * 60]])
async def test_each_input_is_queued_at_its_estimated_cost(
    inputs: list[str | list[int]], truncate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt's characters counted with the text's, a truncated one at most the model's
    length, token ids by their number: texts alone or among token ids."""
    engine = HashEmbedder(
        name="serving-embed-costs", max_len=16, prompts={"q": "query: "}, default_prompt_name="q"
    )
    queued: list[tuple[list[str], list[int]]] = []
    async with started(engine) as runtime:
        queue = runtime.embedding_model.queue  # type: ignore[union-attr]
        real_submit = queue.submit

        async def submit(items, timeout_s, costs=None):  # type: ignore[no-untyped-def]
            queued.append(([item.text for item in items], list(costs)))
            return await real_submit(items, timeout_s, costs)

        monkeypatch.setattr(queue, "submit", submit)
        await embed(runtime, InProcessClient(), EmbeddingRequest(inputs, "input", truncate=truncate))
    texts, costs = queued[0]
    cap = 16 if truncate else 10**9
    expected = [min(len(x) // 3 + 2, cap) if x else 4 for x in texts]  # "query: …", or 4 ids
    assert texts[0] == "query: a b" and costs == expected


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
