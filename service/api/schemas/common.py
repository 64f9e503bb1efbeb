"""What every API's bodies share: the text fields and their ceilings, the strict bases of the
bodies that are ours to define (ours, OpenAI's, the rerank ones), and ``json_response``.

A strict request (``RequestBody``) forbids unknown fields, so a typo is a 422 rather than a
silently ignored option, and takes no coercion (``"4"`` is not an int). LibreTranslate's and
DeepL's bodies are their APIs' own, which ignore what they do not know. Text fields accept one
string or a list; an empty or whitespace-only text, or one with a NUL character, is a 422. The
schemas declare absolute ceilings (``HARD_MAX_*``); the configured, usually lower, limits
(``max_items_per_request``, ``max_chars_per_text``) and what the loaded model serves are checked
by the serving layer (``service/serving/``), which answers in the same 422 shape.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError
from starlette.responses import Response

from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS

MAX_BEAM = 8


def _usable_text(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank_text", "text must not be empty or whitespace-only")
    if "\x00" in text:  # never text: a binary payload, or a client's C-string bug
        raise PydanticCustomError("nul_character", "text must not contain NUL characters (U+0000)")
    return text


def _one_or_many(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise PydanticCustomError("text_type", "must be a string or a list of strings")
    return value


Text = Annotated[str, StringConstraints(max_length=HARD_MAX_CHARS), AfterValidator(_usable_text)]
TextList = Annotated[list[Text], Field(min_length=1, max_length=HARD_MAX_ITEMS)]
_ONE_TEXT_SCHEMA = {"type": "string", "minLength": 1, "maxLength": HARD_MAX_CHARS}
ONE_OR_MANY_SCHEMAS = [
    _ONE_TEXT_SCHEMA,
    {"type": "array", "items": _ONE_TEXT_SCHEMA, "minItems": 1, "maxItems": HARD_MAX_ITEMS},
]
# One string or a list; always a list once parsed, so error locations are ``text[i]``.
OneOrManyTexts = Annotated[
    TextList, BeforeValidator(_one_or_many), WithJsonSchema({"anyOf": ONE_OR_MANY_SCHEMAS})
]


FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


def documented_body(schema: type[BaseModel] | dict[str, Any], *media_types: str) -> dict[str, Any]:
    """The OpenAPI request body (a route's ``openapi_extra``) of a route that reads its body by
    hand: ``schema`` under each of ``media_types``."""
    fields = schema if isinstance(schema, dict) else schema.model_json_schema()
    content = {media: {"schema": fields} for media in media_types}
    return {"requestBody": {"required": True, "content": content}}


def json_or_form(schema: type[BaseModel]) -> dict[str, Any]:
    """``documented_body`` of a body taken as JSON or as a form (LibreTranslate's, DeepL's)."""
    return documented_body(schema, "application/json", *FORMS)


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


def json_response(body: BaseModel | dict[str, Any] | list[Any], status_code: int = 200) -> Response:
    """A model serialised by pydantic-core, or a plain dict or list (NumPy arrays included) by orjson:
    the embedding routes build their bodies as dicts of float32 arrays, which orjson writes
    without a Python float per value and without validating what the service itself built.
    Both are Rust; neither writes ``None`` fields of a model."""
    if isinstance(body, BaseModel):
        content = body.model_dump_json(exclude_none=True).encode()
    else:
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status_code, media_type="application/json")
