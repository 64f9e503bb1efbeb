"""DeepL's (v2) request bodies, as its clients send them (JSON, or a form's fields): ``/v2/translate``
and ``/v2/glossaries``. What DeepL defines and the service does not use is ignored, not refused
(``service/api/deepl.py`` says which options are). Its answers are written as DeepL's reference
documents them, without models: the routes stay out of the OpenAPI document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.api.schemas.common import OneOrManyTexts


class DeepLTranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # DeepL's many other options: see the docstring

    text: OneOrManyTexts
    target_lang: str = Field(max_length=16)
    source_lang: str | None = Field(default=None, max_length=16)
    glossary_id: str | None = Field(default=None, max_length=256)
    tag_handling: Literal["html"] | None = None
    split_sentences: Literal["0", "1", "nonewlines"] = "1"
    preserve_formatting: bool = True  # accepted; whitespace and line breaks are always kept
    formality: Literal["default", "prefer_more", "prefer_less"] = "default"

    @field_validator("preserve_formatting", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        return value in ("1", "true", True) if isinstance(value, str | bool) else value


class DeepLGlossaryRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=256)
    source_lang: str = Field(max_length=16)
    target_lang: str = Field(max_length=16)
    entries: str = Field(min_length=1)
    entries_format: Literal["tsv", "csv"] = "tsv"
