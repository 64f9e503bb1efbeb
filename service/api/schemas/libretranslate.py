"""LibreTranslate's request and response bodies, as its clients send and read them: ``/translate``,
``/detect``, ``/languages``, and its error body ``{"error": "..."}``. Its field names, not ours
(``q``, ``translatedText``), and its leniency: what it does not know is ignored, not refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas.common import MAX_BEAM, OneOrManyTexts


class LibreTranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # LibreTranslate ignores what it does not know

    q: OneOrManyTexts
    source: str = Field(max_length=16, description='A served source language, or "auto"')
    target: str = Field(max_length=16)
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(default=0, ge=0, le=MAX_BEAM - 1, description="Extra translations per text")
    api_key: str | None = Field(default=None, max_length=256)
    # Ours, not LibreTranslate's: a glossary of /v1/glossaries (its id, or its name for the pair)
    # and spans kept as written, as /v1/translate takes them.
    glossary: str | None = Field(default=None, min_length=1, max_length=256)
    keep: list[Annotated[str, Field(min_length=1, max_length=1000)]] = Field(
        default_factory=list, max_length=100
    )


class DetectRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # LibreTranslate ignores what it does not know

    q: OneOrManyTexts
    api_key: str | None = Field(default=None, max_length=256)


class LibreTranslateDetection(BaseModel):
    language: str
    confidence: float


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's field names
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: LibreTranslateDetection | None = None


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class LibreTranslateErrorBody(BaseModel):
    error: str
