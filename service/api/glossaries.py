"""``/v1/glossaries``: glossaries created, listed, read and deleted as JSON; a translation
request names one by id or by name (``/v1/translate``'s and LibreTranslate's ``glossary``).

Each glossary is its API key's (``service/glossaries/store.py``): another key neither sees nor
uses it; with API keys off all requests share them.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api.dependencies import ServingRuntime, bearer_token, runtime_of
from service.api.error_responses import ERROR_RESPONSES, GATED_RESPONSES
from service.api.schemas.common import json_response
from service.api.schemas.tserve import GlossaryEntryOut, GlossaryInfo, GlossaryList, GlossaryRequest
from service.glossaries.entries import Entry
from service.glossaries.store import Glossary, GlossaryNotFound, GlossaryStore
from service.serving.access import check_api_key
from service.serving.terminology import UnknownGlossary, create_glossary

router = APIRouter(tags=["glossaries"])
_BY_ID_RESPONSES = {**GATED_RESPONSES, 404: {**ERROR_RESPONSES[404], "description": "No such glossary"}}


def glossary_store(request: Request) -> GlossaryStore:
    store: GlossaryStore = request.app.state.glossaries
    return store


def owner_key(request: Request, offered: list[str | None]) -> str | None:
    """The configured API key among ``offered`` whose glossaries the request sees (None with
    API keys off: every request sees the same ones)."""
    return check_api_key(runtime_of(request).settings.api_keys, offered)


def glossary_of(store: GlossaryStore, key: str | None, glossary_id: str) -> Glossary:
    try:
        return store.get(key, glossary_id)
    except GlossaryNotFound as e:
        raise UnknownGlossary(str(e)) from e


@router.post("/v1/glossaries", status_code=201, response_model=GlossaryInfo, responses=ERROR_RESPONSES)
async def create(body: GlossaryRequest, request: Request, runtime: ServingRuntime) -> Response:
    """Create a glossary for a language pair some model serves (422 otherwise)."""
    key = owner_key(request, [bearer_token(request)])
    entries = [Entry(e.source, e.target, e.case_sensitive, e.whole_word) for e in body.entries]
    languages = (body.source_language, body.target_language)
    made = await asyncio.to_thread(
        create_glossary, runtime, glossary_store(request), key, body.name, languages, entries
    )
    return json_response(_info(made, with_entries=False), 201)


@router.get("/v1/glossaries", response_model=GlossaryList, responses=GATED_RESPONSES)
async def listed(request: Request) -> Response:
    """The API key's glossaries, oldest first, without their entries."""
    key = owner_key(request, [bearer_token(request)])
    glossaries = glossary_store(request).list(key)
    return json_response(GlossaryList(glossaries=[_info(g, with_entries=False) for g in glossaries]))


@router.get("/v1/glossaries/{glossary_id}", response_model=GlossaryInfo, responses=_BY_ID_RESPONSES)
async def read(glossary_id: str, request: Request) -> Response:
    """One glossary with its entries (404 for an id the key has none of)."""
    key = owner_key(request, [bearer_token(request)])
    return json_response(_info(glossary_of(glossary_store(request), key, glossary_id), with_entries=True))


@router.delete("/v1/glossaries/{glossary_id}", status_code=204, responses=_BY_ID_RESPONSES)
async def delete(glossary_id: str, request: Request) -> Response:
    key = owner_key(request, [bearer_token(request)])
    store = glossary_store(request)
    try:
        await asyncio.to_thread(store.delete, key, glossary_id)
    except GlossaryNotFound as e:
        raise UnknownGlossary(str(e)) from e
    return Response(status_code=204)


def _info(glossary: Glossary, *, with_entries: bool) -> GlossaryInfo:
    return GlossaryInfo(
        id=glossary.id,
        name=glossary.name,
        source_language=glossary.source_language,
        target_language=glossary.target_language,
        entry_count=len(glossary.entries),
        created_at=glossary.created_at,
        entries=[
            GlossaryEntryOut(
                source=e.source, target=e.target, case_sensitive=e.case_sensitive, whole_word=e.whole_word
            )
            for e in glossary.entries
        ]
        if with_entries
        else None,
    )
