"""Request and response bodies, with a limit on every field.

Requests are strict (``"4"`` is not an int) and forbid unknown fields, so a typo is a 422
rather than a silently ignored option. Text fields accept one string or a list; an empty or
whitespace-only text, or one with a NUL character, is a 422. The schemas declare absolute
ceilings (``HARD_MAX_*``); the configured, usually lower, limits (``max_items_per_request``,
``max_chars_per_text``) and what the loaded model serves are checked by the serving layer
(``service/serving/``), which answers in the same 422 shape.

Contract for a list whose items are valid JSON but one cannot be computed (e.g. a text over
the model's max length with ``truncate: false``): the whole request fails with 422, and the
error's ``details`` name every offending index (``texts[3]``). Results are all-or-nothing, so
the response arrays always line up with the request's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError
from starlette.responses import Response

from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS, HARD_MAX_REQUEST_CHARS

MAX_BEAM = 8
MAX_OUTPUT_TOKENS = 512


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
Language = Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*$", max_length=16)]
SourceLanguage = Annotated[  # a Language, or "auto": detect it
    str, StringConstraints(pattern=r"^(auto|[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*)$", max_length=16)
]


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


def json_response(body: BaseModel | dict[str, Any], status_code: int = 200) -> Response:
    """A model serialised by pydantic-core, or a plain dict (NumPy arrays included) by orjson:
    the embedding routes build their bodies as dicts of float32 arrays, which orjson writes
    without a Python float per value and without validating what the service itself built.
    Both are Rust; neither writes ``None`` fields of a model."""
    if isinstance(body, BaseModel):
        content = body.model_dump_json(exclude_none=True).encode()
    else:
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status_code, media_type="application/json")


# ---- translation -----------------------------------------------------------------------------


class TranslateRequest(RequestBody):
    """Translate one text or a list; the response has one translation per text, in order."""

    text: Annotated[
        OneOrManyTexts,
        Field(
            description="One text or a list: sentences, paragraphs, documents (format text) or HTML; "
            f"all together at most max_translate_chars_per_request characters "
            f"(ceiling {HARD_MAX_REQUEST_CHARS:,}) and max_sentences_per_request sentences"
        ),
    ]
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="A translation model of GET /v1/models; default: the model serving "
        "source_language → target_language, or the first one when neither is given",
    )
    source_language: SourceLanguage | None = Field(
        default=None,
        description="Routes to the model translating from it (checked against the model's); an ISO "
        "639-1 or 639-2/-3 code or NLLB's (de, deu, deu_Latn); auto: each text's language is "
        "detected among those served, and the text routed by it",
    )
    target_language: Language | None = Field(
        default=None,
        description="Routes to the model translating into it (checked against the model's); any code "
        "source_language takes",
    )
    beam_size: int = Field(default=4, ge=1, le=MAX_BEAM, description="1 = greedy")
    n_best: int = Field(default=1, ge=1, le=MAX_BEAM, description="Hypotheses per text, at most beam_size")
    max_length: int | None = Field(
        default=None,
        ge=1,
        le=MAX_OUTPUT_TOKENS,
        description="Output tokens per sentence, at most the model's max_output_tokens (its default)",
    )
    length_penalty: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="score = log-prob / length ** penalty; default: the model's length_penalty "
        "(GET /v1/models: tuned on its validation set, else 1.0)",
    )
    alignments: bool = Field(
        default=False, description="Return tokens and source-target attention per hypothesis"
    )
    format: Literal["text", "html"] = Field(
        default="text",
        description="text: sentences, whitespace and line breaks kept; html: text nodes translated, "
        'markup kept (script, style, code and translate="no" elements are not translated)',
    )
    glossary: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="A glossary of /v1/glossaries, by id or by name for the pair translated: each "
        "source term found in a sentence puts its target term in that sentence's translation",
    )
    keep: list[Annotated[str, StringConstraints(min_length=1, max_length=1000)]] = Field(
        default_factory=list,
        max_length=100,
        description="Spans left exactly as written wherever they appear ({count}, product names)",
    )

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"text": "A man is riding a bicycle.", "beam_size": 4}]}
    )

    @field_validator("n_best")
    @classmethod
    def _n_best_within_beam(cls, n_best: int, info: ValidationInfo) -> int:
        beam_size = info.data.get("beam_size")  # absent when beam_size itself was invalid
        if beam_size is not None and n_best > beam_size:
            raise PydanticCustomError(
                "n_best_over_beam",
                "n_best ({n_best}) must not exceed beam_size ({limit})",
                {"n_best": n_best, "limit": beam_size},
            )
        return n_best


class Hypothesis(ResponseBody):
    text: str
    score: float = Field(description="Length-normalised log-probability")
    tokens: list[str] | None = Field(default=None, description="Target subwords (with alignments)")
    alignment: list[list[float]] | None = Field(
        default=None, description="(target tokens × source tokens) attention"
    )


class SentenceResult(ResponseBody):
    source: str = Field(description="The source sentence as the model read it")
    start: int | None = Field(default=None, description="Its first character in the text (format text)")
    end: int | None = Field(default=None, description="One past its last character (format text)")
    pieces: int = Field(
        description="1, or the pieces it was cut into because it is longer than the model's input"
    )
    hypotheses: list[Hypothesis] = Field(description="Best first, n_best of them")
    source_tokens: list[str] | None = Field(default=None, description="Source subwords (with alignments)")


class DetectedLanguage(ResponseBody):
    language: str = Field(description="Its code, as /v1/models' languages name it")
    confidence: float = Field(description="0–100")


class TranslationResult(ResponseBody):
    hypotheses: list[Hypothesis] = Field(
        description="Of the whole text, best first; a text's score is its sentences' scores "
        "averaged with their output tokens as weights. tokens and alignment: one-sentence texts only"
    )
    source_tokens: list[str] | None = Field(
        default=None, description="Source subwords (with alignments, one-sentence texts only)"
    )
    sentences: list[SentenceResult] = Field(description="The text's sentences in order, each translated")
    detected_language: DetectedLanguage | None = Field(
        default=None, description='source_language "auto": the language detected in the text'
    )


class TranslateUsage(ResponseBody):
    input_tokens: int
    output_tokens: int


class TranslateResponse(ResponseBody):
    model: str = Field(description='The model that translated (source_language "auto": the first text\'s)')
    source_language: str = Field(description='Translated from (source_language "auto": the first text\'s)')
    target_language: str
    translations: list[TranslationResult]
    usage: TranslateUsage


# ---- models, health, errors ------------------------------------------------------------------


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


class HealthResponse(ResponseBody):
    status: Literal["alive", "loading", "ready", "draining", "failed"]
    detail: str | None = None
    models: list[str] | None = None


class ErrorDetail(ResponseBody):
    field: str
    message: str
    type: str
    limit: int | float | str | None = None


class ErrorBody(ResponseBody):
    type: str = Field(description="Machine-readable kind, e.g. validation_error, queue_full")
    message: str
    limit: int | float | str | None = Field(
        default=None, description="The limit that was exceeded, when one applies"
    )
    details: list[ErrorDetail] | None = None
    request_id: str | None = Field(default=None, description="Quote it when reporting a 5xx")


class ErrorResponse(ResponseBody):
    error: ErrorBody
