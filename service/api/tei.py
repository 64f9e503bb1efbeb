"""Hugging Face text-embeddings-inference's (TEI's) HTTP API over the served embedding model, so
that its clients (``huggingface_hub``'s ``InferenceClient``, LangChain's
``HuggingFaceEndpointEmbeddings``, LlamaIndex's and Haystack's TEI embedders) work unchanged:
``POST /embed``, ``POST /``, ``POST /similarity``, ``POST /tokenize``, ``POST /decode``,
``GET /info``. Its ``POST /rerank`` is ``service/api/rerank.py``.

``POST /`` answers what the body asks, as TEI's root answers for the model it serves: a rerank
body (``query`` and ``texts``) is ranked by the served reranker, ``inputs`` holding
``source_sentence`` is a similarity, any other ``inputs`` an embedding. Embeddings run the same
path as ``/v1/embed`` (``service/serving/embedding.py``), so the vectors are its own. The key is a
bearer token, as TEI takes it; errors have TEI's shape (``tei_error``). Bodies are read here
rather than by FastAPI, so that a body's own faults are answered in that shape too.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from service.api import rerank as rerank_api
from service.api.dependencies import HttpClient, check_bearer_key, runtime_of
from service.api.error_responses import answer, documented, http_failure, tei_error
from service.api.hot_path import hot
from service.api.schemas.common import documented_body, json_response
from service.api.schemas.rerank import RerankRequest, TeiRank
from service.api.schemas.tei import (
    TeiDecodeRequest,
    TeiEmbedRequest,
    TeiErrorBody,
    TeiInfo,
    TeiSimilarityRequest,
    TeiToken,
    TeiTokenizeRequest,
)
from service.serving import embedding, tokens
from service.serving.access import ready
from service.serving.failures import SERVING_ERRORS, InvalidRequest, UnsupportedMediaType, problem
from service.serving.rerank import choose_rerank_model
from service.serving.routing import choose_embedding_model
from service.serving.runtime import Runtime

router = APIRouter(tags=["tei"])
Body = TypeVar("Body", bound=BaseModel)

_ERRORS = documented(
    TeiErrorBody,
    {
        400: "No inputs (`empty`), or a body that is not valid JSON",
        401: "API key missing",
        403: "API key wrong",
        404: "No embedding model served (or no reranker, for a rerank body)",
        413: "Request body too large",
        415: "Body not sent as JSON",
        422: "Invalid request (`validation`): the field and the limit in the message",
        424: "The model failed on the batch (`backend`)",
        429: "Queue full (`overloaded`); retry after the Retry-After header's seconds",
        503: "Not ready yet, or shutting down (`unhealthy`)",
        504: "Deadline exceeded",
    },
)


def _json_body(schema: type[BaseModel] | dict[str, Any]) -> dict[str, Any]:
    return documented_body(schema, "application/json")


async def _in_tei_shape(request: Request, work: Callable[[Runtime, Any], Awaitable[Response]]) -> Response:
    """``work`` with the runtime and the body's JSON, once the key and readiness are there;
    every refusal in TEI's shape."""
    try:
        check_bearer_key(request)
        runtime = ready(runtime_of(request))
        return await work(runtime, await _json(request))
    except HTTPException as e:  # the body stream's limits (413, 408, 400)
        return tei_error(http_failure(e))
    except SERVING_ERRORS as e:
        return answer(request, e, tei_error)


async def _json(request: Request) -> Any:
    if request.method == "GET":
        return None
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in ("application/json", ""):
        raise UnsupportedMediaType(f"send the body as JSON (Content-Type: application/json), not {media}")
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise InvalidRequest([problem("json_invalid", ("body",), f"the body is not valid JSON: {e}")]) from e


def _validated(schema: type[Body], received: Any) -> Body:
    try:
        return schema.model_validate(received)
    except ValidationError as e:
        raise InvalidRequest(e.errors(include_url=False)) from e


@router.post(
    "/embed", response_model=list[list[float]], responses=_ERRORS, openapi_extra=_json_body(TeiEmbedRequest)
)
@hot  # read by hand, in TEI's error shape: served as its endpoint alone
async def embed(request: Request) -> Response:
    """One vector per input (TEI's ``/embed``): the vectors ``/v1/embed`` gives."""
    return await _in_tei_shape(request, lambda runtime, received: _embed(request, runtime, received))


async def _embed(request: Request, runtime: Runtime, received: Any) -> Response:
    body = _validated(TeiEmbedRequest, received)
    asked = embedding.EmbeddingRequest(
        body.inputs,
        "inputs",
        truncate=True if body.truncate is None else body.truncate,
        normalize=body.normalize,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
    )
    done = await embedding.embed(runtime, HttpClient(request), asked)
    return json_response([e.vector for e in done.embeddings])  # as /v1/embed writes them


@router.post(
    "/similarity",
    response_model=list[float],
    responses=_ERRORS,
    openapi_extra=_json_body(TeiSimilarityRequest),
)
async def similarity(request: Request) -> Response:
    """The cosine similarity of ``inputs.source_sentence`` with each of ``inputs.sentences``."""
    return await _in_tei_shape(request, lambda runtime, received: _similarity(request, runtime, received))


async def _similarity(request: Request, runtime: Runtime, received: Any) -> Response:
    body = _validated(TeiSimilarityRequest, received)
    options = body.parameters
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    asked = embedding.EmbeddingRequest(
        texts,
        "inputs",  # the source sentence first, then the sentences: counted together, as TEI counts them
        truncate=options is None or options.truncate is None or options.truncate,
        normalize=False,
        prompt_name=options.prompt_name if options else None,
    )
    done = await embedding.embed(runtime, HttpClient(request), asked)
    vectors = np.asarray([np.asarray(e.vector, dtype=np.float64) for e in done.embeddings])
    norms = np.linalg.norm(vectors, axis=1)
    cosines = vectors[1:] @ vectors[0] / np.maximum(norms[1:] * norms[0], np.finfo(np.float64).tiny)
    return json_response([float(c) for c in cosines])


_ROOT_BODY = {
    "anyOf": [m.model_json_schema() for m in (TeiEmbedRequest, TeiSimilarityRequest, RerankRequest)]
}
_ROOT_ANSWER = list[list[float]] | list[float] | list[TeiRank]


@router.post("/", response_model=_ROOT_ANSWER, responses=_ERRORS, openapi_extra=_json_body(_ROOT_BODY))
@hot
async def root(request: Request) -> Response:
    """TEI's root: an embedding, a similarity or a ranking, as the body asks (the module says how)."""
    return await _in_tei_shape(request, lambda runtime, received: _root(request, runtime, received))


async def _root(request: Request, runtime: Runtime, received: Any) -> Response:
    if isinstance(received, dict) and "query" in received and "texts" in received:
        choose_rerank_model(runtime)
        return await rerank_api.rerank(_validated(RerankRequest, received), request, runtime)
    inputs = received.get("inputs") if isinstance(received, dict) else None
    if isinstance(inputs, dict):
        return await _similarity(request, runtime, received)
    return await _embed(request, runtime, received)


@router.post(
    "/tokenize",
    response_model=list[list[TeiToken]],
    responses=_ERRORS,
    openapi_extra=_json_body(TeiTokenizeRequest),
)
async def tokenize(request: Request) -> Response:
    """Each input's tokens: id, text, whether special, and character offsets (the prompt's included)."""

    async def work(runtime: Runtime, received: Any) -> Response:
        body = _validated(TeiTokenizeRequest, received)
        found = await tokens.tokenize(
            runtime, body.inputs, "inputs", body.add_special_tokens, body.prompt_name
        )
        return json_response([[asdict(t) for t in text] for text in found])

    return await _in_tei_shape(request, work)


@router.post(
    "/decode", response_model=list[str], responses=_ERRORS, openapi_extra=_json_body(TeiDecodeRequest)
)
async def decode(request: Request) -> Response:
    """Each list of token ids as text."""

    async def work(runtime: Runtime, received: Any) -> Response:
        body = _validated(TeiDecodeRequest, received)
        return json_response(tokens.decode(runtime, body.ids, "ids", body.skip_special_tokens))

    return await _in_tei_shape(request, work)


_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}


@router.get("/info", response_model=TeiInfo, responses=_ERRORS)
async def info(request: Request) -> Response:
    """TEI's description of the served embedding model and of the limits it is served with."""

    async def work(runtime: Runtime, _: Any) -> Response:
        manifest = choose_embedding_model(runtime).engine.manifest
        assert manifest.embedding is not None  # choose_embedding_model serves embedding artefacts only
        settings = runtime.settings
        described = TeiInfo(
            model_id=manifest.name,
            model_sha=manifest.source.sha256,
            model_dtype=_DTYPES.get(manifest.variant, manifest.variant),
            served_model_name=manifest.name,
            model_type={"embedding": {"pooling": manifest.embedding.pooling}},
            max_concurrent_requests=settings.max_queue,
            max_input_length=manifest.embedding.max_len,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_requests=settings.max_batch_size,
            max_client_batch_size=runtime.limits.max_items,
            auto_truncate=True,
            tokenization_workers=1,
            version=request.app.version,
            sha=None,
            docker_label=None,
        )
        return json_response(described.model_dump())

    return await _in_tei_shape(request, work)
