"""Our API's request and response bodies (``/v1/translate``, ``/v1/embed``, ``/v1/glossaries``,
the health routes, and the error body every route of ours answers with), with a limit on every
field; the rules every body follows are in ``common.py``.

Contract for a list whose items are valid JSON but one cannot be computed (e.g. a text over
the model's max length with ``truncate: false``): the whole request fails with 422, and the
error's ``details`` name every offending index (``texts[3]``). Results are all-or-nothing, so
the response arrays always line up with the request's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from service.api.schemas.common import MAX_BEAM, OneOrManyTexts, RequestBody, ResponseBody, TextList
from service.settings import HARD_MAX_REQUEST_CHARS

MAX_OUTPUT_TOKENS = 512

Language = Annotated[str, StringConstraints(pattern=r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*$", max_length=16)]
SourceLanguage = Annotated[  # a Language, or "auto": detect it
    str, StringConstraints(pattern=r"^(auto|[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*)$", max_length=16)
]


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


# ---- embeddings ------------------------------------------------------------------------------


PromptName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
PROMPT_NAME_DESCRIPTION = (
    "One of the model's prompts (GET /v1/models), put before each text; default: its default prompt"
)
DIMENSIONS_DESCRIPTION = (
    "Keep the first N dimensions (Matryoshka), normalised again when normalising; default: all"
)


class EmbedRequest(RequestBody):
    """Embed a list of texts; one vector per text, in order."""

    texts: Annotated[TextList, Field(description="1 to max_items_per_request texts")]
    normalize: bool | None = Field(
        default=None, description="L2-normalise; default: the model's own pipeline"
    )
    prompt_name: PromptName | None = Field(default=None, description=PROMPT_NAME_DESCRIPTION)
    dimensions: int | None = Field(default=None, ge=1, le=65536, description=DIMENSIONS_DESCRIPTION)
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


# ---- glossaries ------------------------------------------------------------------------------


MAX_TERM_CHARS = 10_000  # the ceiling of TSERVE_GLOSSARY_MAX_TERM_CHARS
Term = Annotated[str, Field(min_length=1, max_length=MAX_TERM_CHARS)]


class GlossaryEntry(RequestBody):
    source: Term
    target: Term
    case_sensitive: bool = Field(default=True, description="false: the source term matches in any case")
    whole_word: bool = Field(
        default=True, description="false: the source term matches inside longer words too"
    )


class GlossaryRequest(RequestBody):
    """A glossary: source terms, each translated as its target term wherever it appears."""

    name: str = Field(min_length=1, max_length=256, description="Unique per language pair and API key")
    source_language: Language
    target_language: Language
    entries: list[GlossaryEntry] = Field(
        min_length=1,
        max_length=1_000_000,
        description="At most TSERVE_GLOSSARY_MAX_ENTRIES, each term at most TSERVE_GLOSSARY_MAX_TERM_CHARS",
    )


class GlossaryEntryOut(ResponseBody):
    source: str
    target: str
    case_sensitive: bool
    whole_word: bool


class GlossaryInfo(ResponseBody):
    id: str
    name: str
    source_language: str
    target_language: str
    entry_count: int
    created_at: str
    entries: list[GlossaryEntryOut] | None = None  # in GET /v1/glossaries/{id} only


class GlossaryList(ResponseBody):
    glossaries: list[GlossaryInfo]


# ---- health, errors ---------------------------------------------------------------------------


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
