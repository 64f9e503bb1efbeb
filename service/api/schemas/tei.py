"""Hugging Face text-embeddings-inference's (TEI's) bodies: ``/embed``, ``/similarity``,
``/tokenize``, ``/decode``, ``/info`` and its error shape (``service/api/tei.py`` serves them; its
rerank body is ``service/api/schemas/rerank.py``'s).

Field names and defaults are TEI's (``router/src/http/types.rs``): ``normalize`` true, ``truncate``
the server's (here true), ``add_special_tokens`` and ``skip_special_tokens`` true. Like TEI, the
bodies ignore fields they do not know (its clients send ``parameters`` beside ``inputs``); what
they do know is checked strictly, with our ceilings.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.api.schemas.common import OneOrManyTexts, Text, TextList
from service.api.schemas.openai import TextsOrTokenIds, TokenIds
from service.api.schemas.tserve import DIMENSIONS_DESCRIPTION, PROMPT_NAME_DESCRIPTION, PromptName
from service.settings import HARD_MAX_ITEMS

_TRUNCATE = "Cut inputs at the model's max length; false: 422 instead. Default: true (TEI's --auto-truncate)"
# TEI takes Left too; only Right (tokens cut from the end) is served, as on /rerank.
TruncationDirection = Literal["Right", "right"]


class TeiBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TeiEmbedRequest(TeiBody):
    """``POST /embed`` (and ``POST /`` with ``inputs`` a text or a list): one vector per input."""

    inputs: Annotated[TextsOrTokenIds, Field(description="A text, texts, or token ids (specials included)")]
    normalize: bool = Field(default=True, description="L2-normalise (TEI's default: true)")
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = Field(default="Right", description="Only Right is served")
    prompt_name: PromptName | None = Field(default=None, description=PROMPT_NAME_DESCRIPTION)
    dimensions: int | None = Field(default=None, ge=1, le=65536, description=DIMENSIONS_DESCRIPTION)

    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": "What is Deep Learning?"}]})


class SimilarityInput(TeiBody):
    source_sentence: Text
    sentences: TextList


class SimilarityParameters(TeiBody):
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: TruncationDirection = "Right"
    prompt_name: PromptName | None = Field(default=None, description=PROMPT_NAME_DESCRIPTION)


class TeiSimilarityRequest(TeiBody):
    """``POST /similarity`` (and ``POST /`` with ``inputs`` an object): the cosine similarity of
    ``source_sentence`` with each of ``sentences``."""

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"inputs": {"source_sentence": "a cat", "sentences": ["a dog"]}}]}
    )


class TeiTokenizeRequest(TeiBody):
    inputs: Annotated[OneOrManyTexts, Field(description="A text or texts")]
    add_special_tokens: bool = True
    prompt_name: PromptName | None = Field(default=None, description=PROMPT_NAME_DESCRIPTION)


_ID_LISTS = TypeAdapter(
    Annotated[list[TokenIds], Field(min_length=1, max_length=HARD_MAX_ITEMS)], config=ConfigDict(strict=True)
)


def _one_or_many_id_lists(value: Any) -> list[list[int]]:
    """One token-id list or a list of them, as a list of lists."""
    if not isinstance(value, list):
        raise PydanticCustomError("ids_type", "must be a list of token ids or a list of such lists")
    return _ID_LISTS.validate_python(value if value and isinstance(value[0], list) else [value])


_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}}


class TeiDecodeRequest(TeiBody):
    ids: Annotated[
        list[list[int]],
        PlainValidator(_one_or_many_id_lists),
        WithJsonSchema({"anyOf": [_IDS_SCHEMA, {"type": "array", "items": _IDS_SCHEMA}]}),
        Field(description="Token ids, or a list of token-id lists"),
    ]
    skip_special_tokens: bool = True


class TeiToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TeiErrorBody(BaseModel):
    error: str
    error_type: Literal["unhealthy", "backend", "overloaded", "validation", "tokenizer", "empty"]


class TeiInfo(BaseModel):
    """``GET /info``: TEI's fields, filled from the served embedding model and the settings."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    served_model_name: str
    model_type: dict[str, dict[str, Any]]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None
