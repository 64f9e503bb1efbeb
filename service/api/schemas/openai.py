"""OpenAI's request and response bodies: ``POST /v1/embeddings`` (texts, or token ids in the
model's vocabulary) and ``GET /v1/models`` (OpenAI's list, each model's card carrying what a
client needs besides: its task, languages and limits).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, TypeAdapter, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.api.schemas.common import ONE_OR_MANY_SCHEMAS, RequestBody, ResponseBody, TextList
from service.api.schemas.tserve import DIMENSIONS_DESCRIPTION, PROMPT_NAME_DESCRIPTION, PromptName
from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS

# ---- embeddings ------------------------------------------------------------------------------


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
    dimensions: int | None = Field(default=None, ge=1, le=65536, description=DIMENSIONS_DESCRIPTION)
    prompt_name: PromptName | None = Field(
        default=None,
        description=PROMPT_NAME_DESCRIPTION + " (not OpenAI's: sentence-transformers' and TEI's)",
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


# ---- models ----------------------------------------------------------------------------------


class ModelCard(ResponseBody):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tserve"
    task: Literal["translate", "embed", "rerank"]
    variant: str
    provider: str
    max_input_tokens: int = Field(
        description="Tokens per sentence (translation), text (embeddings) or query-document pair (rerank)"
    )
    max_output_tokens: int | None = Field(default=None, description="Translation: the most max_length")
    length_penalty: float | None = Field(default=None, description="Translation: the default length_penalty")
    alignments: bool | None = Field(
        default=None,
        description="Translation: whether it gives alignments, which place inline markup (format html, "
        "files) on the words it belongs to; without them each text between two tags is translated alone",
    )
    source_languages: list[str] | None = None  # as requests name them: ISO 639-1 where there is one
    target_languages: list[str] | None = None
    dim: int | None = None
    prompts: dict[str, str] | None = Field(default=None, description="Embeddings: prompt_name's choices")
    default_prompt_name: str | None = Field(
        default=None, description="Embeddings: the prompt used unless named"
    )
    trained_on: str | None = Field(
        default=None,
        description="The domain and data the model was trained on, from its model card (absent when "
        "it does not say); text far from that domain translates poorly",
    )


class ModelsResponse(ResponseBody):
    object: Literal["list"] = "list"
    data: list[ModelCard]
