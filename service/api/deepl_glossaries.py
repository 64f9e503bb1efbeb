"""DeepL's glossary API (v2), beside ``service/api/deepl.py``'s translation: ``/v2/glossaries``
(create from TSV or CSV entries, list, get, ``/entries``, delete) and
``/v2/glossary-language-pairs``. Glossaries are the ``/v1/glossaries`` store's, per API key
(``service/glossaries/store.py``); keys, bodies and error shapes are ``deepl.py``'s, and a full
store is DeepL's 456.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from starlette.responses import JSONResponse, Response

from service.api.deepl import (
    BODY_ERRORS,
    admitted,
    error_responses,
    ours,
    validated,
)
from service.api.dependencies import runtime_of
from service.api.error_responses import QUOTA_EXCEEDED, answer, deepl_error
from service.api.glossaries import glossary_of, glossary_store
from service.api.schemas.common import json_or_form
from service.api.schemas.deepl import (
    DeepLGlossaries,
    DeepLGlossaryInfo,
    DeepLGlossaryLanguagePairs,
    DeepLGlossaryRequest,
)
from service.glossaries.entries import GlossaryProblem, as_tsv, parse_entries
from service.glossaries.store import Glossary, GlossaryNotFound
from service.serving.access import ready
from service.serving.failures import SERVING_ERRORS, Failure
from service.serving.routing import translation_models
from service.serving.terminology import UnknownGlossary, create_glossary, refused

router = APIRouter(tags=["deepl"])
GlossaryIdInPath = Annotated[str, PathParam(max_length=256)]  # as long as a body's glossary_id


@router.get(
    "/v2/glossary-language-pairs",
    response_model=DeepLGlossaryLanguagePairs,
    responses=error_responses(503),
)
@router.post(
    "/v2/glossary-language-pairs",
    response_model=DeepLGlossaryLanguagePairs,
    responses=error_responses(*BODY_ERRORS, 503),
)
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


@router.post(
    "/v2/glossaries",
    status_code=201,
    response_model=DeepLGlossaryInfo,
    responses=error_responses(*BODY_ERRORS, QUOTA_EXCEEDED, 503),
    openapi_extra=json_or_form(DeepLGlossaryRequest),
)
async def create(request: Request) -> Response:
    try:
        key, fields = await admitted(request)
        body = validated(DeepLGlossaryRequest, fields)
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
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return JSONResponse(_info(made), 201)


@router.get("/v2/glossaries", response_model=DeepLGlossaries, responses=error_responses())
async def listed(request: Request) -> Response:
    try:
        key, _ = await admitted(request)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return JSONResponse({"glossaries": [_info(g) for g in glossary_store(request).list(key)]})


@router.get(
    "/v2/glossaries/{glossary_id}", response_model=DeepLGlossaryInfo, responses=error_responses(400, 404)
)
async def read(glossary_id: GlossaryIdInPath, request: Request) -> Response:
    return await _with_glossary(request, glossary_id, lambda found: JSONResponse(_info(found)))


@router.get(
    "/v2/glossaries/{glossary_id}/entries",
    response_class=Response,  # not JSON
    responses={
        200: {
            "content": {"text/tab-separated-values": {"schema": {"type": "string"}}},
            "description": "One source<TAB>target entry a line",
        },
        **error_responses(400, 404),
    },
)
async def entries(glossary_id: GlossaryIdInPath, request: Request) -> Response:
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


@router.delete("/v2/glossaries/{glossary_id}", status_code=204, responses=error_responses(400, 404))
async def delete(glossary_id: GlossaryIdInPath, request: Request) -> Response:
    store = glossary_store(request)
    try:
        key, _ = await admitted(request)
        await asyncio.to_thread(store.delete, key, glossary_id)
    except GlossaryNotFound as e:
        return deepl_error(Failure(404, UnknownGlossary.type, str(e)))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return Response(status_code=204)


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


def _lower(code: str) -> str:
    return code.lower()
