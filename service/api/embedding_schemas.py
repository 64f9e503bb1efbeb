"""Request and response bodies of the embedding routes: ``POST /v1/embed`` and OpenAI's
``POST /v1/embeddings`` (texts, or token ids in the model's vocabulary). The shared field types
and limits are in ``schemas.py``, as are the rules every body follows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, StringConstraints, TypeAdapter, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.api.schemas import ONE_OR_MANY_SCHEMAS, RequestBody, ResponseBody, TextList
from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS

# ---- embeddings ------------------------------------------------------------------------------


PromptName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
_PROMPT_NAME = (
    "One of the model's prompts (GET /v1/models), put before each text; default: its default prompt"
)
_DIMENSIONS = "Keep the first N dimensions (Matryoshka), normalised again when normalising; default: all"


class EmbedRequest(RequestBody):
    """Embed a list of texts; one vector per text, in order."""

    texts: Annotated[TextList, Field(description="1 to max_items_per_request texts")]
    normalize: bool | None = Field(
        default=None, description="L2-normalise; default: the model's own pipeline"
    )
    prompt_name: PromptName | None = Field(default=None, description=_PROMPT_NAME)
    dimensions: int | None = Field(default=None, ge=1, le=65536, description=_DIMENSIONS)
    truncate: bool = Field(
        default=True, description="Cut texts at the model's max length; false: 422 instead"
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"texts": ["A man is eating food."]}]})


class EmbedUsage(ResponseBody):
    input_tokens: int


class EmbedResponse(ResponseBody):
    model: str
    dim: int
    embeddings: list[list[float]]
    n_tokens: list[int] = Field(description="Tokens used per text (after truncation)")
    usage: EmbedUsage


# ---- OpenAI-compatible embeddings --------------------------------------------------------------


_STRICT = ConfigDict(strict=True)
_TEXTS = TypeAdapter(TextList, config=_STRICT)
TokenIds = Annotated[
    list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1, max_length=HARD_MAX_CHARS)
]
_TOKEN_ID_LISTS = TypeAdapter(
    Annotated[list[TokenIds], Field(min_length=1, max_length=HARD_MAX_ITEMS)], config=_STRICT
)


def _texts_or_token_ids(value: Any) -> list[str] | list[list[int]]:
    """One text, texts, one token-id list or token-id lists (OpenAI's four forms), as a list;
    errors located by index (``input[2]``, ``input[1][3]``)."""
    if isinstance(value, str):
        return _TEXTS.validate_python([value])
    if not isinstance(value, list):
        raise PydanticCustomError("text_type", "must be a string, a list of strings, or token ids")
    first = value[0] if value else None
    if isinstance(first, list):
        return _TOKEN_ID_LISTS.validate_python(value)
    if isinstance(first, int) and not isinstance(first, bool):
        return _TOKEN_ID_LISTS.validate_python([value])
    return _TEXTS.validate_python(value)


_TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_TOKEN_ID_LISTS_SCHEMA = {
    "type": "array",
    "items": _TOKEN_IDS_SCHEMA,
    "minItems": 1,
    "maxItems": HARD_MAX_ITEMS,
}
TextsOrTokenIds = Annotated[
    list[str] | list[list[int]],
    PlainValidator(_texts_or_token_ids),
    WithJsonSchema({"anyOf": [*ONE_OR_MANY_SCHEMAS, _TOKEN_IDS_SCHEMA, _TOKEN_ID_LISTS_SCHEMA]}),
]


class OpenAIEmbeddingRequest(RequestBody):
    """``POST /v1/embeddings`` as OpenAI defines it; inputs over the model's length are truncated."""

    input: Annotated[
        TextsOrTokenIds,
        Field(
            description="Texts, or token ids in the model's vocabulary: its whole input, specials included"
        ),
    ]
    model: str | None = Field(
        default=None, max_length=256, description="The served model's name; default: it"
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: little-endian float32 bytes, as OpenAI"
    )
    dimensions: int | None = Field(default=None, ge=1, le=65536, description=_DIMENSIONS)
    prompt_name: PromptName | None = Field(
        default=None, description=_PROMPT_NAME + " (not OpenAI's: sentence-transformers' and TEI's)"
    )
    user: str | None = Field(default=None, max_length=256, description="Accepted and ignored")


class OpenAIEmbedding(ResponseBody):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(ResponseBody):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(ResponseBody):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage
