"""DeepL's API (v2), so its clients (the official ``deepl`` libraries with ``server_url``, tools
built on them) work against this service: ``/v2/translate``, ``/v2/languages`` and
``/v2/usage``; glossaries are ``service/api/deepl_glossaries.py``, documents
``service/api/deepl_documents.py``.

Bodies come as JSON or as forms (``text`` repeated), as DeepL takes them; the key as DeepL sends
it, ``Authorization: DeepL-Auth-Key <key>`` (or a bearer token, or the legacy ``auth_key``
field), checked against ``TSERVE_API_KEYS``. Errors have DeepL's shape, ``{"message": ...}``, and
its statuses: 400 for any invalid request, 403 for a missing or wrong key, 404 for an unknown
glossary, 456 when the glossaries are full; ours where DeepL has none (413, 429, 503, 504).

Language codes are DeepL's (``DE``, ``EN-US``, ``PT-BR``): a regional variant is its language
(``EN-GB`` and ``EN-US`` both ask for the model's English). Translation runs ``/v1/translate``'s
path (limits, sentence batching, quotas, glossaries as the constrained search enforces them).
Not offered: ``formality`` other than ``default``/``prefer_*`` (no model has formal and informal
registers), ``tag_handling=xml``, ``context``, and
``split_sentences`` other than as a hint (sentences are always split: the models translate
sentence by sentence, and line breaks are always kept).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, TypeVar

import langcodes
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, Response

from service.api.dependencies import HttpClient, runtime_of
from service.api.error_responses import QUOTA_EXCEEDED, answer, deepl_error, documented
from service.api.glossaries import glossary_store
from service.api.schemas.common import FORMS, json_or_form
from service.api.schemas.deepl import (
    DeepLErrorBody,
    DeepLLanguage,
    DeepLLanguagesRequest,
    DeepLTranslateRequest,
    DeepLTranslateResponse,
    DeepLUsage,
)
from service.serving import translation
from service.serving.access import check_api_key, ready
from service.serving.detection import AUTO
from service.serving.failures import SERVING_ERRORS, Failure, InvalidRequest, UnsupportedMediaType, problem
from service.serving.routing import UnservedLanguages, translation_models
from service.serving.terminology import Terminology

router = APIRouter(tags=["deepl"])
M = TypeVar("M", bound=BaseModel)

_LISTS = ("text", "non_splitting_tags", "splitting_tags", "ignore_tags")  # repeated form fields
_MAX_FORM_FIELDS = 2 * 2048 + 32

_ERRORS = documented(
    DeepLErrorBody,
    {
        400: "Invalid request (DeepL's status for every validation error): the field and why",
        403: "API key missing or wrong (Authorization: DeepL-Auth-Key <key>)",
        404: "No such glossary (or document) for this key",
        408: "Request body not complete in time",
        413: "Request body (or the document, or its text) too large",
        415: "Body neither JSON nor a form (or a document format not translated)",
        429: "Queue full, too many documents in flight, or the key over its quota; see Retry-After",
        QUOTA_EXCEEDED: "The glossaries' limits reached (DeepL's quota status)",
        500: "Internal error",
        503: "Not ready yet, shutting down (or the document not translated yet)",
        504: "Deadline exceeded",
    },
)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` in DeepL's error shape, for a route answering only ``statuses``
    (403 for the key, which every route checks, always)."""
    return {status: _ERRORS[status] for status in sorted({403, *statuses})}


BODY_ERRORS = (400, 408, 413, 415)  # a body read by hand, JSON or a form
_SERVING_ERRORS = (429, 500, 503, 504)
_TYPE_PARAMETER = {
    "parameters": [
        {
            "name": "type",
            "in": "query",
            "required": False,
            "schema": {"enum": ["source", "target"], "default": "source"},
        }
    ]
}


@router.post(
    "/v2/translate",
    response_model=DeepLTranslateResponse,
    responses=error_responses(*BODY_ERRORS, 404, *_SERVING_ERRORS),
    openapi_extra=json_or_form(DeepLTranslateRequest),
)
async def translate(request: Request) -> Response:
    """Translate ``text`` (one or many) into ``target_lang``; DeepL's answer shape."""
    try:
        key, fields = await admitted(request)
        body = validated(DeepLTranslateRequest, fields)
        source = ours(body.source_lang) if body.source_lang else AUTO
        if body.glossary_id and source == AUTO:
            raise _invalid("source_lang", "source_lang is required when a glossary_id is given")
        asked = translation.TranslationRequest(
            texts=body.text,
            field="text",
            format="html" if body.tag_handling == "html" else "text",
            source=source,
            target=ours(body.target_lang),
            first_of_several=True,  # DeepL's clients cannot name a model
            api_key=key,
            terminology=Terminology(glossary_store(request), body.glossary_id, key, field="glossary_id"),
        )
        done = await translation.translate(ready(runtime_of(request)), HttpClient(request), asked)
    except UnservedLanguages as e:  # named by DeepL's fields, not /v1's
        field = "source_lang" if e.reason == "source" else "target_lang"
        return deepl_error(Failure(400, "unsupported_language", f"{field}: {e.problems[0]['msg']}"))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    translated_characters(request)[key or ""] += sum(len(t) for t in body.text)
    # DeepL names every text's source: the language detected in it, else the one asked for
    if done.detected is None:
        detected = [done.source_language] * len(done.texts)
    else:
        detected = [d.language for d in done.detected]
    return JSONResponse(
        {
            "translations": [
                {
                    "detected_source_language": _theirs(language),
                    "text": t.hypotheses[0].text,
                    "billed_characters": len(source_text),
                }
                for t, language, source_text in zip(done.texts, detected, body.text, strict=True)
            ]
        }
    )


@router.get(
    "/v2/languages",
    response_model=list[DeepLLanguage],
    responses=error_responses(400, 503),
    openapi_extra=_TYPE_PARAMETER,
)
@router.post(
    "/v2/languages",
    response_model=list[DeepLLanguage],
    responses=error_responses(*BODY_ERRORS, 503),
    openapi_extra=json_or_form(DeepLLanguagesRequest),
)
async def languages(request: Request) -> Response:
    """Source languages, or with ``type=target`` the target ones (in query or body)."""
    try:
        _, fields = await admitted(request)
        kind = validated(
            DeepLLanguagesRequest, {"type": request.query_params.get("type", "source")} | fields
        ).type
        served = translation_models(ready(runtime_of(request)))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    codes = dict.fromkeys(c for t in served for c in (t.sources if kind == "source" else t.targets))
    if kind == "source":
        return JSONResponse([{"language": _theirs(c), "name": _name(c)} for c in codes])
    listed = [(variant, c) for c in codes for variant in _target_variants(c)]
    return JSONResponse([{"language": v, "name": _name(c), "supports_formality": False} for v, c in listed])


@router.get("/v2/usage", response_model=DeepLUsage, responses=error_responses())
@router.post("/v2/usage", response_model=DeepLUsage, responses=error_responses(*BODY_ERRORS))
async def usage(request: Request) -> Response:
    """Characters the key translated through ``/v2/translate`` since the service started, and
    its ``characters_per_day`` quota as the limit (DeepL's figure for no limit otherwise)."""
    try:
        key, _ = await admitted(request)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    quota = runtime_of(request).settings.api_key_quotas.get(key or "")
    limit = quota.characters_per_day if quota and quota.characters_per_day else 1_000_000_000_000
    count = translated_characters(request)[key or ""]
    return JSONResponse({"character_count": count, "character_limit": limit})


def translated_characters(request: Request) -> Counter[str]:
    """Characters translated through ``/v2/translate`` per key ("" with API keys off)."""
    counts: Counter[str] = request.app.state.deepl_characters
    return counts


async def admitted(request: Request) -> tuple[str | None, dict[str, Any]]:
    """The body's fields (JSON or a form; none for a GET without one) once the key it offers
    is accepted, and that key."""
    fields = await _fields(request)
    offered = [deepl_key(request), fields.get("auth_key"), request.query_params.get("auth_key")]
    key = check_api_key(
        runtime_of(request).settings.api_keys, [k if isinstance(k, str) else None for k in offered]
    )
    return key, fields


def deepl_key(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() in ("deepl-auth-key", "bearer") and token.strip() else None


async def _fields(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if media in FORMS:
            form = await request.form(max_files=0, max_fields=_MAX_FORM_FIELDS)
            fields: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
            for name in _LISTS:
                if name in fields:
                    fields[name] = [v for v in form.getlist(name) if isinstance(v, str)]
            return fields
        raw = await request.body()
        if not raw.strip():
            return {}
        if media not in ("application/json", ""):
            raise UnsupportedMediaType(f"send JSON or a form, not {media}")
        parsed = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        raise _invalid("body", f"the body is not valid JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise _invalid("body", "expected a JSON object")
    return parsed


def validated(schema: type[M], fields: dict[str, Any]) -> M:
    try:
        return schema.model_validate(fields)
    except ValidationError as e:
        raise InvalidRequest(e.errors()) from e


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest([problem("invalid_parameter", (field,), message)])


def ours(code: str) -> str:
    """A DeepL code as the service's: ``EN-US`` → ``en``, ``ZH-HANT`` → ``zh-Hant``."""
    lowered = code.strip().lower()
    return "zh-Hant" if lowered == "zh-hant" else lowered.split("-")[0]


def _theirs(code: str) -> str:
    """The service's code as DeepL writes a source (and a detected) language: ``DE``."""
    return code.upper()


def _target_variants(code: str) -> list[str]:
    """DeepL lists English and Portuguese as targets only with their regions."""
    return {"en": ["EN-GB", "EN-US"], "pt": ["PT-BR", "PT-PT"]}.get(code, [_theirs(code)])


def _name(code: str) -> str:
    try:
        return str(langcodes.Language.get(code).display_name())
    except (ValueError, LookupError):
        return code
