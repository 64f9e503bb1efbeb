"""OpenAI-compatible routes: ``POST /v1/embeddings`` and ``GET /v1/models``.

Enough of the OpenAI API for its clients (``openai.embeddings.create``, LangChain, LlamaIndex)
to work unchanged. The official Python client asks for base64 by default: little-endian
float32 bytes, which it decodes itself. Vectors follow the model's own pipeline (L2-normalised
for all-MiniLM-L6-v2); over-long texts are truncated, as sentence-transformers does. ``input`` may
be token ids in the model's vocabulary, ``dimensions`` shortens the vectors (Matryoshka), and
``prompt_name`` (sentence-transformers' and TEI's, not OpenAI's) picks one of the model's prompts.
"""

from __future__ import annotations

import base64
from datetime import datetime

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api.dependencies import HttpClient, ServingRuntime
from service.api.embed import EmbeddingRuntime
from service.api.error_responses import ERROR_RESPONSES, GATED_RESPONSES
from service.api.hot_path import hot
from service.api.schemas.common import json_response
from service.api.schemas.openai import (
    ModelCard,
    ModelsResponse,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
)
from service.engine.base import Engine
from service.languages import ModelLanguages
from service.serving import embedding

router = APIRouter(tags=["openai"])


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, responses=ERROR_RESPONSES)
@hot
async def embeddings(body: OpenAIEmbeddingRequest, request: Request, runtime: EmbeddingRuntime) -> Response:
    asked = embedding.EmbeddingRequest(
        body.input, "input", model=body.model, dimensions=body.dimensions, prompt_name=body.prompt_name
    )
    done = await embedding.embed(runtime, HttpClient(request), asked)
    as_base64 = body.encoding_format == "base64"
    tokens = sum(e.n_tokens for e in done.embeddings)
    return json_response(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(e.vector, as_base64)}
                for i, e in enumerate(done.embeddings)
            ],
            "model": done.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _encode(vector: np.ndarray, as_base64: bool) -> np.ndarray | str:
    """float32 values (written as JSON numbers), or OpenAI's base64 of little-endian float32."""
    if as_base64:  # from the array's own bytes (a float32 row of the engine's output is already "<f4")
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").data).decode("ascii")
    return vector


@router.get("/v1/models", response_model=ModelsResponse, responses=GATED_RESPONSES)
async def models(runtime: ServingRuntime) -> Response:
    """The loaded models, OpenAI's shape plus what a client needs (task, languages, limits)."""
    return json_response(ModelsResponse(data=[_card(engine) for engine in runtime.engines]))


def _card(engine: Engine) -> ModelCard:
    m = engine.manifest
    card = ModelCard(
        id=m.name,
        created=_created(m.created_at),
        task=m.task,
        variant=m.variant,
        provider=engine.provider,
        max_input_tokens=0,
        trained_on=m.trained_on,
    )
    if m.translation is not None:
        card.max_input_tokens = m.translation.max_source_len
        card.max_output_tokens = m.translation.max_target_len
        card.length_penalty = m.translation.length_penalty
        card.alignments = m.translation.has_alignments
        languages = ModelLanguages.of(m.translation)  # as requests name them: de, not deu_Latn
        card.source_languages = languages.sources
        card.target_languages = languages.targets
    if m.embedding is not None:
        card.max_input_tokens = m.embedding.max_len
        card.dim = m.embedding.dim
        card.prompts = m.embedding.prompts or None
        card.default_prompt_name = m.embedding.default_prompt_name
    if m.rerank is not None:
        card.max_input_tokens = m.rerank.max_len
    return card


def _created(timestamp: str) -> int:
    try:
        return int(datetime.fromisoformat(timestamp).timestamp())
    except ValueError:
        return 0
