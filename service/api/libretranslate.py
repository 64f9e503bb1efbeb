"""LibreTranslate's HTTP API, so its clients (scripts, browser extensions, ``libretranslatepy``)
work unchanged: ``POST /translate``, ``GET /languages``, ``GET /frontend/settings``.

Bodies come as JSON, URL-encoded or multipart forms, as LibreTranslate accepts them; the API key
as ``api_key`` in the body or query (LibreTranslate's way) or as a bearer token. Errors have
LibreTranslate's shape, ``{"error": "..."}``, and its status codes (400 for any invalid
request, 403 for a missing or wrong key), plus ours where it has none (413, 429 with
Retry-After, 503, 504). Translation runs the same path as ``/v1/translate``: the same limits,
sentence batching, queue, deadline and metrics. ``/detect`` is not offered: there is no language
detector behind this service, and ``source: "auto"`` resolves only when exactly one served model
translates into ``target`` and it reads one language. With several models, a request goes to the
first configured one serving its pair (LibreTranslate's clients cannot name a model).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from typing import Any, Literal

import langcodes
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.api.dependencies import ready_runtime, runtime_of
from service.api.errors import InternalError, ModelNotFound, ServiceError, documented
from service.api.schemas import MAX_BEAM, OneOrManyTexts
from service.api.translate import translate_texts
from service.engine.base import TranslateOptions
from service.lifecycle import Runtime, ServedTranslator
from service.queue import BatcherClosed, DeadlineExceeded, QueueFull

log = logging.getLogger(__name__)

router = APIRouter(tags=["libretranslate"])

_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
_MAX_FORM_FIELDS = 2 * 2048 + 16  # q may repeat once per text


class LibreTranslateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # LibreTranslate ignores what it does not know

    q: OneOrManyTexts
    source: str = Field(max_length=16, description='A served source language, or "auto"')
    target: str = Field(max_length=16)
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(default=0, ge=0, le=MAX_BEAM - 1, description="Extra translations per text")
    api_key: str | None = Field(default=None, max_length=256)


class DetectedLanguage(BaseModel):
    language: str
    confidence: float


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]  # LibreTranslate's field names
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: DetectedLanguage | None = None


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class LibreTranslateErrorBody(BaseModel):
    error: str


_ERRORS = documented(
    LibreTranslateErrorBody,
    {
        400: "Invalid request (LibreTranslate's status for every validation error)",
        403: "API key missing or wrong",
        413: "Request body too large",
        415: "Body neither JSON nor a form",
        429: "Queue full; retry after the Retry-After header's seconds",
        500: "Internal error",
        503: "Not ready yet, or shutting down",
        504: "Deadline exceeded",
    },
)


class LibreTranslateError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


_BODY_SCHEMA = LibreTranslateRequest.model_json_schema()  # parsed by hand: JSON or a form


@router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses=_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {media: {"schema": _BODY_SCHEMA} for media in ("application/json", *_FORMS)},
        }
    },
)
async def translate(request: Request) -> Response:
    """Translate ``q`` (a string or a list) from ``source`` to ``target``; LibreTranslate's shape."""
    runtime = runtime_of(request)
    try:
        body, single = await _parse(request)
        _check_key(runtime, request, body.api_key)
        translator, source = _route(ready_runtime(runtime), body.source, body.target)
        info = translator.engine.manifest.translation
        n = body.alternatives + 1
        options = TranslateOptions(
            beam_size=max(4, n),
            n_best=n,
            max_length=info.max_target_len if info else TranslateOptions.max_length,
            length_penalty=translator.length_penalty,
        )
        try:
            done = await translate_texts(
                request, runtime, translator, body.q, "q", body.format, source, options
            )
        except RequestValidationError as e:
            raise LibreTranslateError(400, "Invalid request: " + _describe(e.errors())) from e
    except LibreTranslateError as e:
        return JSONResponse({"error": e.message}, e.status, headers=e.headers)
    except (ServiceError, QueueFull, DeadlineExceeded, BatcherClosed) as e:
        return _service_error(e)
    texts = [t.hypotheses[0].text for t in done]
    out: dict[str, Any] = {"translatedText": texts[0] if single else texts}
    if body.alternatives:
        alternatives = [[h.text for h in t.hypotheses[1:]] for t in done]
        out["alternatives"] = alternatives[0] if single else alternatives
    if body.source == "auto":
        # Not detected: the one language translated into target (so certain by construction).
        out["detectedLanguage"] = {"language": source, "confidence": 100.0}
    return JSONResponse(out)


@router.get("/languages", response_model=list[Language], responses={s: _ERRORS[s] for s in (403, 503)})
async def languages(request: Request) -> Response:
    """Every language the service reads or writes, with every target some model translates it into."""
    runtime = runtime_of(request)
    try:
        _check_key(runtime, request, None)
        translators = _translators(ready_runtime(runtime))
    except LibreTranslateError as e:
        return JSONResponse({"error": e.message}, e.status, headers=e.headers)
    except ServiceError as e:
        return _service_error(e)
    codes = list(dict.fromkeys(c for t in translators for c in (*t.sources, *t.targets)))
    return JSONResponse(
        [
            {
                "code": code,
                "name": _name(code),
                "targets": list(
                    dict.fromkeys(x for t in translators if code in t.sources for x in t.targets if x != code)
                ),
            }
            for code in codes
        ]
    )


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> Response:
    """What LibreTranslate's web clients ask first: limits, whether a key is needed, the languages."""
    runtime = runtime_of(request)
    translator = runtime.default_translator
    info = translator.engine.manifest.translation if translator else None
    source = info.source_languages[0] if info and info.source_languages else "auto"
    target = info.target_languages[0] if info and info.target_languages else ""
    return JSONResponse(
        {
            "charLimit": runtime.limits.max_translate_chars,
            "frontendTimeout": 500,
            "apiKeys": bool(runtime.settings.api_keys),
            "keyRequired": bool(runtime.settings.api_keys),
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {
                "source": {"code": source, "name": _name(source)},
                "target": {"code": target, "name": _name(target)},
            },
        }
    )


async def _parse(request: Request) -> tuple[LibreTranslateRequest, bool]:
    """The body, and whether ``q`` was one string (then the answer is one string too)."""
    media = _media(request)
    if media not in (*_FORMS, "application/json", ""):
        raise LibreTranslateError(415, f"send JSON or a form, not {media}")
    try:
        if media in _FORMS:
            form = await request.form(max_files=0, max_fields=_MAX_FORM_FIELDS)
            fields = _form_fields(form)
        else:
            fields = json.loads(await request.body())
        if not isinstance(fields, dict):
            raise LibreTranslateError(400, "Invalid request: expected a JSON object")
        return LibreTranslateRequest.model_validate(fields), isinstance(fields.get("q"), str)
    except ValidationError as e:
        raise LibreTranslateError(400, "Invalid request: " + _describe(e.errors())) from e
    except UnicodeDecodeError as e:
        raise LibreTranslateError(400, "Invalid request: the body is not valid UTF-8") from e
    except json.JSONDecodeError as e:
        raise LibreTranslateError(400, f"Invalid request: invalid JSON at character {e.pos}: {e.msg}") from e
    except RecursionError as e:
        raise LibreTranslateError(400, "Invalid request: the JSON is nested too deeply") from e
    except HTTPException as e:  # the body stream's (413, 408, 400) and the form parser's errors
        prefix = "Invalid request: " if e.status_code == 400 else ""
        raise LibreTranslateError(e.status_code, prefix + str(e.detail), dict(e.headers or {})) from e


def _form_fields(form: FormData) -> dict[str, Any]:
    fields: dict[str, Any] = {key: value for key, value in form.items() if isinstance(value, str)}
    q = [v for v in form.getlist("q") if isinstance(v, str)]
    if len(q) > 1:
        fields["q"] = q
    if "alternatives" in fields:
        alternatives = fields["alternatives"]
        fields["alternatives"] = int(alternatives) if alternatives.strip().isdigit() else alternatives
    return fields


def _media(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _check_key(runtime: Runtime, request: Request, body_key: str | None) -> None:
    """Keys configured: one of them, as ``api_key`` in the body or the query or as a bearer token
    (any of those given may match; else 403)."""
    keys = runtime.settings.api_keys
    if not keys:
        return
    bearer = request.headers.get("authorization", "")
    given = [body_key, request.query_params.get("api_key")]
    if bearer[:7].lower() == "bearer ":
        given.append(bearer[7:].strip())
    offered = [g for g in given if g]
    if not offered:
        raise LibreTranslateError(403, "an API key is required: send api_key")
    # Every offered key against every key (no early exit), each in constant time.
    matched = [secrets.compare_digest(g.encode(), key.encode()) for g in offered for key in keys]
    if not any(matched):
        raise LibreTranslateError(403, "Invalid API key")


def _translators(runtime: Runtime) -> list[ServedTranslator]:
    if not runtime.translators:
        raise ModelNotFound("no translation model is loaded (TSERVE_TRANSLATE_MODELS is empty)")
    return list(runtime.translators.values())


def _route(runtime: Runtime, source: str, target: str) -> tuple[ServedTranslator, str]:
    """The first configured model translating ``source`` into ``target``, and the source
    language; ``auto`` only when one model translates into ``target`` from one language."""
    translators = _translators(runtime)
    served = ", ".join(runtime.served_pairs())
    if source == "auto":
        into = [t for t in translators if t.serves(None, target)]
        if not into:
            raise LibreTranslateError(400, f"{target} is not supported (served pairs: {served})")
        if len(into) > 1 or len(into[0].sources) > 1:
            sources = ", ".join(dict.fromkeys(s for t in into for s in t.sources))
            raise LibreTranslateError(
                400,
                f"source 'auto' is ambiguous into {target}: name one of {sources} (no language detection)",
            )
        return into[0], into[0].sources[0]
    if not any(t.serves(source, None) for t in translators):
        raise LibreTranslateError(400, f"{source} is not supported (served pairs: {served})")
    matches = [t for t in translators if t.serves(source, target)]
    if not matches:
        raise LibreTranslateError(400, f"{source}→{target} is not supported (served pairs: {served})")
    return matches[0], source


def _describe(errors: Sequence[Any]) -> str:
    parts = []
    for error in errors[:10]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {error.get('msg')}" if loc else str(error.get("msg")))
    return "; ".join(parts)


def _service_error(e: Exception) -> Response:
    if isinstance(e, QueueFull):
        return JSONResponse({"error": str(e)}, 429, headers={"Retry-After": str(e.retry_after_s)})
    if isinstance(e, DeadlineExceeded):
        return JSONResponse({"error": str(e)}, 504)
    if isinstance(e, BatcherClosed):
        return JSONResponse({"error": str(e)}, 503, headers={"Connection": "close"})
    assert isinstance(e, ServiceError)
    if isinstance(e, InternalError):
        log.error("libretranslate: %s", e.message, exc_info=e.__cause__ or e)
    return JSONResponse({"error": e.message}, e.status_code, headers=e.headers)


def _name(code: str) -> str:
    try:
        return str(langcodes.Language.get(code).display_name())
    except (ValueError, LookupError):
        return code
