"""Embeddings, whichever API asked (``/v1/embed``, OpenAI's ``/v1/embeddings``): the model →
limits → tokenize → submit.

Each text is tokenized once, here: its encoding is the queue's cost and the engine's input. The
engine normalises the vectors when asked (on its worker thread, not on the event loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.engine.base import Embedding, EmbedItem, Encoded
from service.lifecycle import Runtime, ServedEmbedder
from service.queue import off_the_loop_if_large
from service.serving.errors import InvalidRequest, problem
from service.serving.limits import text_problems
from service.serving.routing import choose_embedder
from service.serving.submit import Client, all_or_nothing, submit

_EMBED = ("embed", "queue wait and encoding (batched with other requests)")


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts to embed (all-or-nothing: with ``truncate`` false one over-long text fails the
    request). ``field`` is the texts' field in the API's body, which errors name; ``model`` and
    ``dimensions``, when given, must be the served model's; ``normalize`` None is the model's own
    pipeline."""

    texts: list[str]
    field: str
    truncate: bool = True
    normalize: bool | None = None
    model: str | None = None
    dimensions: int | None = None


@dataclass(frozen=True)
class Embedded:
    model: str
    embeddings: list[Embedding]


async def embed(runtime: Runtime, client: Client, request: EmbeddingRequest) -> Embedded:
    """``request`` embedded, or the first step's refusal (``service.serving.errors``)."""
    embedder = choose_embedder(runtime, request.model)
    manifest = embedder.engine.manifest
    info = manifest.embedding
    dim = info.dim if info is not None else None
    if request.dimensions is not None and request.dimensions != dim:
        message = f"{manifest.name} returns {dim}-dimensional vectors; shortening is not supported"
        raise InvalidRequest([problem("unsupported_dimensions", ("dimensions",), message, dim)])
    texts, field = request.texts, request.field
    problems = text_problems(texts, field, runtime.limits)
    if problems:
        raise InvalidRequest(problems)
    normalize = (
        (info.normalize if info is not None else False) if request.normalize is None else request.normalize
    )
    encodings = await off_the_loop_if_large(sum(len(t) for t in texts), lambda: embedder.engine.encode(texts))
    items = [EmbedItem(t, request.truncate, e, normalize) for t, e in zip(texts, encodings, strict=True)]
    costs = [_cost(e, request.truncate, embedder) for e in encodings]
    results = await submit(client, embedder.batcher, items, costs, runtime.settings.request_timeout_s, _EMBED)
    return Embedded(manifest.name, all_or_nothing(results, field))


def _cost(encoded: Encoded, truncate: bool, embedder: ServedEmbedder) -> int:
    """Tokens the engine will compute: a truncated text costs at most the max length."""
    info = embedder.engine.manifest.embedding
    if truncate and info is not None:
        return min(encoded.n_tokens, info.max_len)
    return encoded.n_tokens
