"""DeepL's (v2) bodies, as its clients send them (JSON, or a form's fields) and read them:
``/v2/translate``, ``/v2/languages``, ``/v2/glossaries``, ``/v2/usage``, ``/v2/document``, and its
error body ``{"message": ...}``. What DeepL defines and the service does not use is ignored, not
refused (``service/api/deepl.py`` says which options are).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from service.api.schemas.common import OneOrManyTexts

LanguageCode = Annotated[
    str, Field(min_length=1, max_length=16, description="DeepL's code: DE, EN-US, PT-BR, ...")
]
GlossaryId = Annotated[str, Field(max_length=256)]
_FLAGS = {"1": True, "true": True, "0": False, "false": False}  # a flag as DeepL's forms send it


class DeepLTranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # DeepL's many other options: see the docstring

    text: OneOrManyTexts
    target_lang: LanguageCode
    source_lang: LanguageCode | None = None
    glossary_id: GlossaryId | None = None
    tag_handling: Literal["html"] | None = None
    split_sentences: Literal["0", "1", "nonewlines"] = "1"
    # accepted; whitespace and line breaks are always kept. DeepL's forms send "0" or "1".
    preserve_formatting: Annotated[
        bool,
        Field(strict=True),
        WithJsonSchema({"anyOf": [{"type": "boolean"}, {"enum": list(_FLAGS)}]}),
    ] = True
    formality: Literal["default", "prefer_more", "prefer_less"] = "default"

    @field_validator("preserve_formatting", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        return _FLAGS.get(value, value) if isinstance(value, str) else value


class DeepLGlossaryRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=256)
    source_lang: LanguageCode
    target_lang: LanguageCode
    entries: str = Field(min_length=1)
    entries_format: Literal["tsv", "csv"] = "tsv"


class DeepLLanguagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["source", "target"] = "source"


class DeepLDocumentForm(BaseModel):
    """``POST /v2/document``'s form fields beside its ``file``."""

    model_config = ConfigDict(extra="ignore")

    target_lang: LanguageCode
    source_lang: LanguageCode | None = None
    glossary_id: GlossaryId | None = None
    glossary_ids: GlossaryId | None = Field(default=None, description="Newer clients' glossary_id")
    output_format: str | None = Field(
        default=None, max_length=16, description="The uploaded file's own format only (no conversion)"
    )
    formality: str | None = Field(default=None, max_length=32, description="Accepted and ignored")


class DeepLDocumentRequest(BaseModel):
    """A document's status or result: the key its upload answered."""

    model_config = ConfigDict(extra="ignore")

    document_key: str = Field(max_length=256)


class DeepLTranslation(BaseModel):
    detected_source_language: str
    text: str
    billed_characters: int


class DeepLTranslateResponse(BaseModel):
    translations: list[DeepLTranslation]


class DeepLLanguage(BaseModel):
    language: str
    name: str
    supports_formality: bool | None = Field(default=None, description="Targets only: always false")


class DeepLLanguagePair(BaseModel):
    source_lang: str
    target_lang: str


class DeepLGlossaryLanguagePairs(BaseModel):
    supported_languages: list[DeepLLanguagePair]


class DeepLUsage(BaseModel):
    character_count: int
    character_limit: int


class DeepLGlossaryInfo(BaseModel):
    glossary_id: str
    name: str
    ready: bool
    source_lang: str
    target_lang: str
    creation_time: str
    entry_count: int


class DeepLGlossaries(BaseModel):
    glossaries: list[DeepLGlossaryInfo]


class DeepLDocumentHandle(BaseModel):
    document_id: str
    document_key: str


class DeepLDocumentStatus(BaseModel):
    document_id: str
    status: Literal["queued", "translating", "done", "error"]
    seconds_remaining: int | None = Field(default=None, description="While queued or translating")
    billed_characters: int | None = Field(default=None, description="Once done")
    error_message: str | None = Field(default=None, description="Once failed")


class DeepLErrorBody(BaseModel):
    message: str
