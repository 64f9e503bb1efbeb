"""``POST /v1/embed``: JSON ↔ ``EmbedItem``s, through the embedding batcher."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.api.dependencies import ready_runtime, runtime_of, until_disconnect
from service.api.errors import ERROR_RESPONSES, ModelNotFound, unpack_results, validation_error
from service.api.gated_route import GatedRoute
from service.api.middleware import timed_stage
from service.api.schemas import EmbedRequest, EmbedResponse, check_texts, json_response
from service.engine.base import Embedding, EmbedItem, Encoded
from service.lifecycle import ServedEmbedder
from service.queue import off_the_loop_if_large

router = APIRouter(tags=["embed"], route_class=GatedRoute)


async def embedder(request: Request) -> ServedEmbedder:
    """The embedding model, once the service is ready: the embedding routes' one gate."""
    runtime = ready_runtime(runtime_of(request))
    if runtime.embedder is None:
        raise ModelNotFound("no embedding model is loaded (TSERVE_EMBED_MODEL is empty)")
    return runtime.embedder


async def embed_texts(
    request: Request, model: ServedEmbedder, texts: list[str], field: str, truncate: bool, normalize: bool
) -> list[Embedding]:
    """Check the configured limits, tokenize, then queue the texts; the request's error if any
    text fails. Each text is tokenized once, here: its encoding is the batcher's cost and the
    engine's input. The engine normalises the vectors when asked (on its worker thread, not on
    the event loop)."""
    runtime = runtime_of(request)
    errors = check_texts(texts, field, runtime.limits)
    if errors:
        raise validation_error(errors)
    chars = sum(len(text) for text in texts)
    encodings = await off_the_loop_if_large(chars, lambda: model.engine.encode(texts))
    items = [
        EmbedItem(text, truncate, encoded, normalize) for text, encoded in zip(texts, encodings, strict=True)
    ]
    costs = [_cost(encoded, truncate, model) for encoded in encodings]
    with timed_stage(request.scope, "embed", "queue wait and encoding (batched with other requests)"):
        results = await until_disconnect(
            request, model.batcher.submit(items, runtime.settings.request_timeout_s, costs)
        )
    return unpack_results(results, field)


def _cost(encoded: Encoded, truncate: bool, model: ServedEmbedder) -> int:
    """Tokens the engine will compute: a truncated text costs at most the max length."""
    info = model.engine.manifest.embedding
    if truncate and info is not None:
        return min(encoded.n_tokens, info.max_len)
    return encoded.n_tokens


def default_normalize(model: ServedEmbedder) -> bool:
    info = model.engine.manifest.embedding
    return info.normalize if info is not None else False


@router.post("/v1/embed", response_model=EmbedResponse, responses=ERROR_RESPONSES)
async def embed(
    body: EmbedRequest,
    request: Request,
    model: Annotated[ServedEmbedder, Depends(embedder)],
) -> Response:
    """Embed texts (all-or-nothing: with ``truncate: false`` one over-long text fails the request)."""
    normalize = default_normalize(model) if body.normalize is None else body.normalize
    embeddings = await embed_texts(request, model, body.texts, "texts", body.truncate, normalize)
    n_tokens = [e.n_tokens for e in embeddings]
    return json_response(
        {
            "model": model.engine.manifest.name,
            "dim": int(embeddings[0].vector.shape[0]),
            "embeddings": [e.vector for e in embeddings],
            "n_tokens": n_tokens,
            "usage": {"input_tokens": sum(n_tokens)},
        }
    )
