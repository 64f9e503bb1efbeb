"""``POST /v1/rerank`` (and ``POST /rerank``, TEI's path): the two bodies rerank clients send ↔ the
rerank serving path (``service/serving/rerank.py``).

One route reads both shapes and answers in the one it was asked in:

* Hugging Face TEI's, told by ``texts``: ``{"query", "texts", "raw_scores", "return_text",
  "truncate"}`` → ``[{"index", "score", "text"?}]``, best first;
* Cohere's (its v1 and v2 rerank), told by ``documents`` (strings, or v1's ``{"text": ...}``
  objects): ``{"query", "documents", "top_n", "return_documents", "model"}`` → ``{"id",
  "results": [{"index", "relevance_score", "document"?: {"text"}}], "meta"}``, best first.

The options of either apply to both (``top_n`` on a TEI body, ``raw_scores`` on a Cohere one).
Scores are the sigmoid of the cross-encoder's logit, TEI's default and Cohere's 0–1 relevance;
``raw_scores`` gives the logits. Scores are written from the serving path's float32 array by
orjson (the shortest decimal that reads back as the float32, as TEI's f32 scores), never as
Python floats. Over-long pairs are cut (the document and query longest-first)
unless ``truncate`` is false, which makes them a 422 naming the document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.api.dependencies import HttpClient, runtime_of
from service.api.error_responses import ERROR_RESPONSES, request_id
from service.api.schemas.common import json_response
from service.api.schemas.rerank import CohereResponse, RerankRequest, TeiRank
from service.serving import rerank as serving
from service.serving.access import ready
from service.serving.runtime import Runtime

router = APIRouter(tags=["rerank"])


async def rerank_runtime(request: Request) -> Runtime:
    """The runtime, once the service is ready and serves a reranker (a 503 or 404 before the
    body is validated)."""
    runtime = ready(runtime_of(request))
    serving.choose_rerank_model(runtime)
    return runtime


RerankRuntime = Annotated[Runtime, Depends(rerank_runtime)]


@router.post("/v1/rerank", response_model=list[TeiRank] | CohereResponse, responses=ERROR_RESPONSES)
@router.post("/rerank", response_model=list[TeiRank] | CohereResponse, responses=ERROR_RESPONSES)
async def rerank(body: RerankRequest, request: Request, runtime: RerankRuntime) -> Response:
    """Rank texts or documents by their relevance to the query (TEI's or Cohere's shape)."""
    tei = body.texts is not None
    texts = body.items
    asked = serving.RerankRequest(
        body.query,
        texts,
        "texts" if tei else "documents",
        truncate=body.truncate,
        raw_scores=body.raw_scores,
        top_n=body.top_n,
        model=body.model,
    )
    done = await serving.rerank(runtime, HttpClient(request), asked)
    # iterating the float32 array gives NumPy scalars, which orjson writes as float32s
    ranked = zip(done.indices.tolist(), done.scores, strict=True)
    if tei:
        show = body.return_text
        ranks = [{"index": i, "score": s} | ({"text": texts[i]} if show else {}) for i, s in ranked]
        return json_response(ranks)  # TEI answers a bare list
    show = body.return_documents
    results = [
        {"index": i, "relevance_score": s} | ({"document": {"text": texts[i]}} if show else {})
        for i, s in ranked
    ]
    meta = {"api_version": {"version": "2"}, "tokens": {"input_tokens": done.n_tokens, "output_tokens": 0}}
    return json_response({"id": request_id(request) or "", "results": results, "meta": meta})
