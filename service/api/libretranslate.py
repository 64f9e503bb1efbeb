"""LibreTranslate's HTTP API, so its clients (scripts, browser extensions, ``libretranslatepy``)
work unchanged: ``POST /translate``, ``GET /languages``, ``GET /frontend/settings``, ``POST /suggest``.

Bodies come as JSON, URL-encoded or multipart forms, as LibreTranslate accepts them; the API key
as ``api_key`` in the body or query (LibreTranslate's way) or as a bearer token. Errors have
LibreTranslate's shape, ``{"error": "..."}``, and its status codes (400 for any invalid
request, 403 for a missing or wrong key), plus ours where it has none (413, 429 with
Retry-After, 503, 504). Translation runs the same path as ``/v1/translate``: the same limits,
sentence batching, queue, deadline and metrics. ``source: "auto"`` translates each text from the
language detected in it (``service/serving/detection.py``; ``/detect`` is ``service/api/detect.py``),
reported as ``detectedLanguage`` (a list for a list of texts). With several models, a request goes
to the first configured one serving its pair (LibreTranslate's clients cannot name a model).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TypeVar

import langcodes
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.api.dependencies import HttpClient, bearer_token, runtime_of
from service.api.error_responses import answer, documented, http_failure, libretranslate_error
from service.api.glossaries import glossary_store
from service.api.hot_path import hot
from service.api.schemas.common import FORMS, json_or_form
from service.api.schemas.libretranslate import (
    Language,
    LibreTranslateErrorBody,
    LibreTranslateRequest,
    LibreTranslateResponse,
)
from service.files.registry import FORMATS
from service.serving import translation
from service.serving.access import check_api_key, ready
from service.serving.failures import SERVING_ERRORS, InvalidRequest, UnsupportedMediaType, problem
from service.serving.routing import UnservedLanguages, translation_models
from service.serving.terminology import Terminology

router = APIRouter(tags=["libretranslate"])
Body = TypeVar("Body", bound=BaseModel)

_MAX_FORM_FIELDS = 2 * 2048 + 16  # q may repeat once per text


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


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` in LibreTranslate's error shape, for a route answering only ``statuses``."""
    return {status: _ERRORS[status] for status in statuses}


@router.post(
    "/translate",
    response_model=LibreTranslateResponse,
    response_model_exclude_none=True,
    responses=_ERRORS,
    openapi_extra=json_or_form(LibreTranslateRequest),
)
@hot  # its body is parsed by hand (JSON or a form): served as its endpoint alone
async def translate(request: Request) -> Response:
    """Translate ``q`` (a string or a list) from ``source`` to ``target``; LibreTranslate's shape."""
    runtime = runtime_of(request)
    try:
        body, single, key = await admitted_body(request, LibreTranslateRequest)
        n = body.alternatives + 1
        asked = translation.TranslationRequest(
            texts=body.q,
            field="q",
            format=body.format,
            source=body.source,
            target=body.target,
            beam_size=max(4, n),
            n_best=n,
            first_of_several=True,  # its clients cannot name a model
            api_key=key,
            terminology=Terminology(
                glossary_store(request), body.glossary, key, tuple(body.keep), "glossary"
            ),
        )
        done = await translation.translate(ready(runtime), HttpClient(request), asked)
    except UnservedLanguages as e:
        return JSONResponse({"error": _unserved(e)}, 400)
    except HTTPException as e:  # the body stream's limits (413, 408)
        return libretranslate_error(http_failure(e))
    except SERVING_ERRORS as e:
        return answer(request, e, libretranslate_error)
    texts = [t.hypotheses[0].text for t in done.texts]
    out: dict[str, Any] = {"translatedText": texts[0] if single else texts}
    if body.alternatives:
        alternatives = [[h.text for h in t.hypotheses[1:]] for t in done.texts]
        out["alternatives"] = alternatives[0] if single else alternatives
    if done.detected:
        languages = [{"confidence": d.confidence, "language": d.language} for d in done.detected]
        out["detectedLanguage"] = languages[0] if single else languages
    return JSONResponse(out)


@router.get("/languages", response_model=list[Language], responses=error_responses(503))
async def languages(request: Request) -> Response:
    """Every language the service reads or writes, with every target some model translates it into.
    Open without a key, as LibreTranslate's is: its web page lists them before a key is entered."""
    runtime = runtime_of(request)
    try:
        served = translation_models(ready(runtime))
    except SERVING_ERRORS as e:
        return answer(request, e, libretranslate_error)
    codes = list(dict.fromkeys(c for t in served for c in (*t.sources, *t.targets)))
    return JSONResponse(
        [
            {
                "code": code,
                "name": _name(code),
                "targets": list(
                    dict.fromkeys(x for t in served if code in t.sources for x in t.targets if x != code)
                ),
            }
            for code in codes
        ]
    )


@router.get("/frontend/settings")
async def frontend_settings(request: Request) -> Response:
    """What LibreTranslate's web clients ask first: limits, whether a key is needed, the languages."""
    runtime = runtime_of(request)
    served = runtime.default_translation_model
    source = served.sources[0] if served and served.sources else "auto"
    target = served.targets[0] if served and served.targets else ""
    return JSONResponse(
        {
            "charLimit": runtime.limits.max_translate_chars,
            "frontendTimeout": 500,
            "apiKeys": bool(runtime.settings.api_keys),
            "keyRequired": bool(runtime.settings.api_keys),
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": list(FORMATS),
            "language": {
                "source": {"code": source, "name": _name(source)},
                "target": {"code": target, "name": _name(target)},
            },
        }
    )


@router.post("/suggest", status_code=403, responses=error_responses(403))
async def suggest() -> Response:
    """LibreTranslate's answer when suggestions are off (``"suggestions": false`` in the settings):
    no model learns from them here."""
    return JSONResponse({"error": "Suggestions are disabled on this server."}, 403)


async def admitted_body(request: Request, schema: type[Body]) -> tuple[Body, bool, str | None]:
    """``parse_body``'s body and whether ``q`` was one string, once the API key it offers (its
    ``api_key``, the query's or a bearer token) is accepted; and that key, to charge its quota."""
    body, single = await parse_body(request, schema)
    in_body: str | None = getattr(body, "api_key", None)
    key = check_api_key(runtime_of(request).settings.api_keys, offered_keys(request, in_body))
    return body, single, key


async def parse_body(request: Request, schema: type[Body]) -> tuple[Body, bool]:
    """The body as JSON or a form (LibreTranslate takes either), validated by ``schema``, and
    whether ``q`` was one string (then the answer is one string too)."""
    media = _media(request)
    if media not in (*FORMS, "application/json", ""):
        raise UnsupportedMediaType(f"send JSON or a form, not {media}")
    try:
        if media in FORMS:
            form = await request.form(max_files=0, max_fields=_MAX_FORM_FIELDS)
            fields = _form_fields(form)
        else:
            fields = json.loads(await request.body())
        if not isinstance(fields, dict):
            raise _invalid("expected a JSON object")
        return schema.model_validate(fields), isinstance(fields.get("q"), str)
    except ValidationError as e:
        raise InvalidRequest(e.errors()) from e
    except UnicodeDecodeError as e:
        raise _invalid("the body is not valid UTF-8") from e
    except json.JSONDecodeError as e:
        raise _invalid(f"invalid JSON at character {e.pos}: {e.msg}") from e
    except RecursionError as e:
        raise _invalid("the JSON is nested too deeply") from e
    except ValueError as e:  # json's int(): more digits than Python converts
        raise _invalid(f"a number has more than {sys.get_int_max_str_digits()} digits") from e
    except HTTPException as e:  # the body stream's and the form parser's: a 400 is an invalid request
        if e.status_code != 400:
            raise
        raise _invalid(str(e.detail), dict(e.headers or {})) from e


def _invalid(reason: str, headers: dict[str, str] | None = None) -> InvalidRequest:
    return InvalidRequest([problem("invalid_body", (), reason)], headers=headers)


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


def offered_keys(request: Request, body_key: str | None) -> list[str | None]:
    """LibreTranslate's ``api_key`` in the body or the query, or a bearer token (any may match)."""
    return [body_key, request.query_params.get("api_key"), bearer_token(request)]


def _unserved(refused: UnservedLanguages) -> str:
    """LibreTranslate's words for languages no model serves (it has no model to name)."""
    if refused.reason == "source":
        asked = refused.source
    else:
        asked = refused.target if refused.source is None else f"{refused.source}→{refused.target}"
    return f"{asked} is not supported (served pairs: {refused.served})"


def _name(code: str) -> str:
    try:
        return str(langcodes.Language.get(code).display_name())
    except (ValueError, LookupError):
        return code
