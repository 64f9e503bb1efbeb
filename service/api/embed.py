"""``POST /v1/embed``: its JSON ↔ the embedding serving path (``service/serving/embedding.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.api.dependencies import HttpClient, runtime_of
from service.api.error_responses import ERROR_RESPONSES
from service.api.hot_path import hot
from service.api.schemas.common import json_response
from service.api.schemas.tserve import EmbedRequest, EmbedResponse
from service.serving import embedding
from service.serving.access import ready
from service.serving.routing import choose_embedding_model
from service.serving.runtime import Runtime

router = APIRouter(tags=["embed"])


async def embedding_runtime(request: Request) -> Runtime:
    """The runtime, once the service is ready and serves embeddings: the embedding routes' one
    dependency besides the key (so a 503 or 404 comes before the body is validated)."""
    runtime = ready(runtime_of(request))
    choose_embedding_model(runtime)
    return runtime


EmbeddingRuntime = Annotated[Runtime, Depends(embedding_runtime)]


@router.post("/v1/embed", response_model=EmbedResponse, responses=ERROR_RESPONSES)
@hot
async def embed(body: EmbedRequest, request: Request, runtime: EmbeddingRuntime) -> Response:
    """Embed texts (all-or-nothing: with ``truncate: false`` one over-long text fails the request)."""
    asked = embedding.EmbeddingRequest(
        body.texts,
        "texts",
        truncate=body.truncate,
        normalize=body.normalize,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
    )
    done = await embedding.embed(runtime, HttpClient(request), asked)
    n_tokens = [e.n_tokens for e in done.embeddings]
    return json_response(
        {
            "model": done.model,
            "dim": int(done.embeddings[0].vector.shape[0]),
            "embeddings": [e.vector for e in done.embeddings],
            "n_tokens": n_tokens,
            "usage": {"input_tokens": sum(n_tokens)},
        }
    )
