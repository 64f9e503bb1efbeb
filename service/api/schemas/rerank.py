"""The rerank bodies, Hugging Face TEI's and Cohere's (``service/api/rerank.py`` says how one
route reads both): one request model that takes either shape, and each shape's answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from service.api.schemas.common import Text, TextList
from service.settings import HARD_MAX_ITEMS


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
        extra="forbid",  # strict, as every request body of ours (common.RequestBody)
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
