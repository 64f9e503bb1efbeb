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
``raw_scores`` gives the logits. Over-long pairs are cut (the document and query longest-first)
unless ``truncate`` is false, which makes them a 422 naming the document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from starlette.responses import Response

from service.api.dependencies import HttpClient, runtime_of
from service.api.errors import ERROR_RESPONSES, request_id
from service.api.schemas import Text, TextList, json_response
from service.serving import rerank as serving
from service.serving.access import ready
from service.serving.runtime import Runtime
from service.settings import HARD_MAX_ITEMS

router = APIRouter(tags=["rerank"])


def _document_texts(value: Any) -> Any:
    """Cohere v1's ``{"text": ...}`` documents as their text (v2 sends strings); anything else
    is left for the list's own validation to refuse."""
    if not isinstance(value, list):
        return value
    return [d["text"] if isinstance(d, dict) and set(d) == {"text"} else d for d in value]


# the constraints on the list itself, not on ``Documents | None`` (None has no length)
Documents = Annotated[
    list[Text], BeforeValidator(_document_texts), Field(min_length=1, max_length=HARD_MAX_ITEMS)
]


class RerankRequest(BaseModel):
    """A query and the texts (TEI) or documents (Cohere) to rank by it: exactly one of the two."""

    model_config = ConfigDict(
        extra="forbid",  # strict, as every request body (service/api/schemas.py)
        strict=True,
        json_schema_extra={
            "examples": [{"query": "What is a cat?", "texts": ["A cat is an animal.", "Paris"]}]
        },
    )

    query: Text
    texts: Annotated[TextList | None, Field(description="TEI's shape: answered as TEI answers")] = None
    documents: Documents | None = Field(
        default=None, description='Cohere\'s shape (strings or {"text": ...}): answered as Cohere answers'
    )
    raw_scores: bool = Field(default=False, description="The logits instead of their sigmoid")
    return_text: bool = Field(default=False, description="TEI: each result carries its text")
    return_documents: bool = Field(default=False, description='Cohere: each result carries {"text"}')
    top_n: int | None = Field(default=None, ge=1, le=HARD_MAX_ITEMS, description="Only the best so many")
    truncate: bool = Field(
        default=True, description="Cut over-long pairs at the model's max length; false: 422 instead"
    )
    truncation_direction: Literal["Right", "right"] = Field(
        default="Right", description="TEI: tokens are cut from the end (the only direction served)"
    )
    model: str | None = Field(default=None, max_length=256, description="The served reranker's name")

    @model_validator(mode="after")
    def _one_shape(self) -> RerankRequest:
        if (self.texts is None) == (self.documents is None):
            raise PydanticCustomError(
                "texts_or_documents", "give texts (TEI's shape) or documents (Cohere's shape), exactly one"
            )
        return self

    @property
    def items(self) -> list[str]:
        return self.texts if self.texts is not None else self.documents or []


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class CohereDocument(BaseModel):
    text: str


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: CohereDocument | None = None


class CohereResponse(BaseModel):
    id: str
    results: list[CohereResult]
    meta: dict[str, Any]


async def rerank_runtime(request: Request) -> Runtime:
    """The runtime, once the service is ready and serves a reranker (a 503 or 404 before the
    body is validated)."""
    runtime = ready(runtime_of(request))
    serving.choose_reranker(runtime)
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
    if tei:
        show = body.return_text
        ranks = [
            {"index": r.index, "score": r.score} | ({"text": texts[r.index]} if show else {})
            for r in done.ranking
        ]
        return Response(orjson.dumps(ranks), media_type="application/json")  # TEI answers a bare list
    show = body.return_documents
    results = [
        {"index": r.index, "relevance_score": r.score}
        | ({"document": {"text": texts[r.index]}} if show else {})
        for r in done.ranking
    ]
    meta = {"api_version": {"version": "2"}, "tokens": {"input_tokens": done.n_tokens, "output_tokens": 0}}
    return json_response({"id": request_id(request) or "", "results": results, "meta": meta})
