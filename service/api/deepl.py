"""DeepL's API (v2), so its clients (the official ``deepl`` libraries with ``server_url``, tools
built on them) work against this service: ``/v2/translate``, ``/v2/glossaries`` (create from TSV
or CSV entries, list, get, ``/entries``, delete), ``/v2/glossary-language-pairs``,
``/v2/languages`` and ``/v2/usage``; documents are ``service/api/deepl_documents.py``.

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

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import langcodes
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.api.dependencies import HttpClient, runtime_of
from service.api.error_responses import answer, http_failure
from service.api.glossaries import glossary_of, glossary_store
from service.api.schemas.deepl import DeepLGlossaryRequest, DeepLTranslateRequest
from service.glossaries.entries import GlossaryProblem, as_tsv, parse_entries
from service.glossaries.store import Glossary, GlossaryNotFound
from service.serving import translation
from service.serving.access import check_api_key, ready
from service.serving.detection import AUTO
from service.serving.failures import SERVING_ERRORS, Failure, InvalidRequest, UnsupportedMediaType, problem
from service.serving.routing import translation_models
from service.serving.terminology import Terminology, UnknownGlossary, create_glossary, refused

# DeepL's own reference documents these routes (docs/api.md says what differs): they stay out of
# /openapi.json, whose contract is this service's shapes.
router = APIRouter(tags=["deepl"], include_in_schema=False)
M = TypeVar("M", bound=BaseModel)

_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
_LISTS = ("text", "non_splitting_tags", "splitting_tags", "ignore_tags")  # repeated form fields
_MAX_FORM_FIELDS = 2 * 2048 + 32
_QUOTA_EXCEEDED = 456  # DeepL's status for a spent quota (here: the glossaries' limits)


@router.post("/v2/translate")
async def translate(request: Request) -> Response:
    """Translate ``text`` (one or many) into ``target_lang``; DeepL's answer shape."""
    try:
        key, fields = await admitted(request)
        body = _validated(DeepLTranslateRequest, fields)
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
    except HTTPException as e:  # the body stream's limits (413, 408)
        return deepl_error(http_failure(e))
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


@router.api_route("/v2/languages", methods=["GET", "POST"])
async def languages(request: Request) -> Response:
    """Source languages, or with ``type=target`` the target ones (in query or body)."""
    try:
        _, fields = await admitted(request)
        kind = fields.get("type") or request.query_params.get("type") or "source"
        if kind not in ("source", "target"):
            raise _invalid("type", "type must be source or target")
        served = translation_models(ready(runtime_of(request)))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    codes = dict.fromkeys(c for t in served for c in (t.sources if kind == "source" else t.targets))
    if kind == "source":
        return JSONResponse([{"language": _theirs(c), "name": _name(c)} for c in codes])
    listed = [(variant, c) for c in codes for variant in _target_variants(c)]
    return JSONResponse([{"language": v, "name": _name(c), "supports_formality": False} for v, c in listed])


@router.api_route("/v2/glossary-language-pairs", methods=["GET", "POST"])
async def glossary_language_pairs(request: Request) -> Response:
    """Every pair some model translates: a glossary may be made for each."""
    try:
        await admitted(request)
        served = translation_models(ready(runtime_of(request)))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    pairs = dict.fromkeys((s, t) for m in served for s in m.sources for t in m.targets if s != t)
    return JSONResponse(
        {"supported_languages": [{"source_lang": _lower(s), "target_lang": _lower(t)} for s, t in pairs]}
    )


@router.api_route("/v2/usage", methods=["GET", "POST"])
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


@router.post("/v2/glossaries", status_code=201)
async def create(request: Request) -> Response:
    try:
        key, fields = await admitted(request)
        body = _validated(DeepLGlossaryRequest, fields)
        try:
            entries = parse_entries(body.entries, body.entries_format)
        except GlossaryProblem as e:
            raise refused(e) from e
        runtime = ready(runtime_of(request))
        languages = (ours(body.source_lang), ours(body.target_lang))
        made = await asyncio.to_thread(
            create_glossary,
            runtime,
            glossary_store(request),
            key,
            body.name,
            languages,
            entries,
            ("source_lang", "target_lang"),
        )
    except HTTPException as e:
        return deepl_error(http_failure(e))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return JSONResponse(_info(made), 201)


@router.get("/v2/glossaries")
async def listed(request: Request) -> Response:
    try:
        key, _ = await admitted(request)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return JSONResponse({"glossaries": [_info(g) for g in glossary_store(request).list(key)]})


@router.get("/v2/glossaries/{glossary_id}")
async def read(glossary_id: str, request: Request) -> Response:
    return await _with_glossary(request, glossary_id, lambda found: JSONResponse(_info(found)))


@router.get("/v2/glossaries/{glossary_id}/entries")
async def entries(glossary_id: str, request: Request) -> Response:
    """The entries as TSV, one ``source<TAB>target`` per line (DeepL's only format here)."""
    return await _with_glossary(
        request,
        glossary_id,
        lambda found: Response(as_tsv(found.entries), media_type="text/tab-separated-values; charset=utf-8"),
    )


async def _with_glossary(
    request: Request, glossary_id: str, answer_with: Callable[[Glossary], Response]
) -> Response:
    """The key's glossary ``glossary_id`` as ``answer_with`` answers it, or DeepL's refusal."""
    try:
        key, _ = await admitted(request)
        found = glossary_of(glossary_store(request), key, glossary_id)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return answer_with(found)


@router.delete("/v2/glossaries/{glossary_id}", status_code=204)
async def delete(glossary_id: str, request: Request) -> Response:
    store = glossary_store(request)
    try:
        key, _ = await admitted(request)
        await asyncio.to_thread(store.delete, key, glossary_id)
    except GlossaryNotFound as e:
        return deepl_error(Failure(404, UnknownGlossary.type, str(e)))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return Response(status_code=204)


def deepl_error(failure: Failure, request_id: str | None = None) -> JSONResponse:
    """DeepL's shape and statuses (see the module's docstring)."""
    headers = dict(failure.headers)
    if failure.type in ("unauthorized", "forbidden"):
        return JSONResponse({"message": f"Authorization failure: {failure.message}"}, 403)
    if failure.problems is not None:
        status = 400
        if any(p.get("type") == "glossary_full" for p in failure.problems):
            status = _QUOTA_EXCEEDED
        message = "; ".join(_described(p) for p in failure.problems[:10])
        return JSONResponse({"message": message}, status, headers=headers)
    return JSONResponse({"message": failure.message}, failure.status, headers=headers)


def _described(found: Any) -> str:
    where = ""
    for part in found.get("loc", ()):
        if part != "body":
            where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    return f"{where}: {found.get('msg')}" if where else str(found.get("msg"))


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
        if media in _FORMS:
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


def _validated(schema: type[M], fields: dict[str, Any]) -> M:
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


def _lower(code: str) -> str:
    return code.lower()


def _target_variants(code: str) -> list[str]:
    """DeepL lists English and Portuguese as targets only with their regions."""
    return {"en": ["EN-GB", "EN-US"], "pt": ["PT-BR", "PT-PT"]}.get(code, [_theirs(code)])


def _name(code: str) -> str:
    try:
        return str(langcodes.Language.get(code).display_name())
    except (ValueError, LookupError):
        return code


def _info(glossary: Glossary) -> dict[str, Any]:
    return {
        "glossary_id": glossary.id,
        "name": glossary.name,
        "ready": True,
        "source_lang": _lower(glossary.source_language),
        "target_lang": _lower(glossary.target_language),
        "creation_time": glossary.created_at,
        "entry_count": len(glossary.entries),
    }
