"""DeepL's document API, so the official clients' ``translate_document`` works: ``POST
/v2/document`` (multipart upload), ``POST /v2/document/{id}`` (status), ``POST
/v2/document/{id}/result`` (the file, once).

A document is translated in the background (``service/files/documents.py``) by the file path of
``/v1/translate/file``: the same formats, limits and queue. ``output_format`` may only name the
uploaded format (no conversion is offered), ``formality`` is accepted and ignored (no model has
registers), ``glossary_id`` (or the newer clients' ``glossary_ids``, one id) needs ``source_lang``.
Keys and error shapes are ``service/api/deepl.py``'s.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse, Response

from service.api.deepl import BODY_ERRORS, admitted, deepl_key, error_responses, ours, validated
from service.api.dependencies import runtime_of
from service.api.error_responses import answer, deepl_error
from service.api.files import download
from service.api.glossaries import glossary_store
from service.api.schemas.common import documented_body, json_or_form
from service.api.schemas.deepl import (
    DeepLDocumentForm,
    DeepLDocumentHandle,
    DeepLDocumentRequest,
    DeepLDocumentStatus,
)
from service.files.documents import Documents
from service.files.refusals import FileTooLarge
from service.files.registry import FileRequest, file_format
from service.serving.access import check_api_key, ready
from service.serving.failures import SERVING_ERRORS, InvalidRequest, problem
from service.serving.terminology import Terminology

router = APIRouter(tags=["deepl"])

_MAX_FORM_FIELDS = 16
DocumentId = Annotated[str, PathParam(max_length=64, description="As the upload answered it")]


def _upload_form() -> dict[str, Any]:
    """The multipart form of an upload: ``file`` and ``DeepLDocumentForm``'s fields, each a
    string (an optional one is left out rather than sent empty)."""
    fields = DeepLDocumentForm.model_json_schema()
    properties: dict[str, Any] = {"file": {"type": "string", "format": "binary"}}
    for name, field in fields["properties"].items():
        string = next(option for option in field.get("anyOf", [field]) if option.get("type") == "string")
        described = {"description": field["description"]} if "description" in field else {}
        properties[name] = {**string, **described}
    schema = {"type": "object", "required": ["file", *fields["required"]], "properties": properties}
    return documented_body(schema, "multipart/form-data")


@router.post(
    "/v2/document",
    response_model=DeepLDocumentHandle,
    responses=error_responses(*BODY_ERRORS, 404, 429, 503),
    openapi_extra=_upload_form(),
)
async def upload(request: Request) -> Response:
    """Accept a document for translation: ``{"document_id", "document_key"}``."""
    runtime = runtime_of(request)
    try:
        form = await request.form(max_files=1, max_fields=_MAX_FORM_FIELDS)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        key = check_api_key(runtime.settings.api_keys, [deepl_key(request), fields.get("auth_key")])
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise _invalid("file", "missing the file")
        asked_for = validated(DeepLDocumentForm, fields)
        filename = upload.filename or ""
        extension = file_format(filename).extension  # 415 for a format not translated
        wanted = (asked_for.output_format or "").lower().lstrip(".")
        if wanted and f".{wanted}" != extension:
            raise _invalid("output_format", f"{extension} documents are translated into {extension} only")
        source = ours(asked_for.source_lang) if asked_for.source_lang else "auto"
        glossary = asked_for.glossary_id or asked_for.glossary_ids or None
        if glossary and source == "auto":
            raise _invalid("source_lang", "source_lang is required when a glossary_id is given")
        asked = FileRequest(
            filename=filename,
            data=await upload.read(),
            source=source,
            target=ours(asked_for.target_lang),
            first_of_several=True,  # DeepL's clients cannot name a model
            api_key=key,
            terminology=Terminology(glossary_store(request), glossary, key, field="glossary_id"),
        )
        if len(asked.data) > runtime.settings.max_file_bytes:  # refused now, not in the background
            limit = runtime.settings.max_file_bytes
            raise FileTooLarge(f"the file has {len(asked.data)} bytes, more than {limit}", limit=limit)
        document = documents(request).submit(ready(runtime), asked)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return JSONResponse({"document_id": document.id, "document_key": document.key})


@router.post(
    "/v2/document/{document_id}",
    response_model=DeepLDocumentStatus,
    response_model_exclude_none=True,
    responses=error_responses(*BODY_ERRORS, 404),
    openapi_extra=json_or_form(DeepLDocumentRequest),
)
async def status(document_id: DocumentId, request: Request) -> Response:
    """Where the document is: ``queued``, ``translating``, ``done`` or ``error``."""
    try:
        key, fields = await admitted(request)
        asked = validated(DeepLDocumentRequest, fields)
        document = documents(request).find(document_id, asked.document_key, key)
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    out: dict[str, Any] = {"document_id": document.id, "status": document.status}
    if document.result is not None:
        out["billed_characters"] = document.result.characters
    elif document.error is not None:
        out["error_message"] = document.error
    else:  # at most the translation's deadline
        elapsed = runtime_of(request).settings.request_timeout_s - (time.monotonic() - document.started_at)
        out["seconds_remaining"] = max(1, round(elapsed))
    return JSONResponse(out)


@router.post(
    "/v2/document/{document_id}/result",
    response_class=Response,  # not JSON
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The translated document"},
        **error_responses(*BODY_ERRORS, 404, 503),
    },
    openapi_extra=json_or_form(DeepLDocumentRequest),
)
async def result(document_id: DocumentId, request: Request) -> Response:
    """The translated document, once it is done; given once."""
    try:
        key, fields = await admitted(request)
        store = documents(request)
        asked = validated(DeepLDocumentRequest, fields)
        translated = store.take(store.find(document_id, asked.document_key, key))
    except SERVING_ERRORS as e:
        return answer(request, e, deepl_error)
    return download(translated)


def documents(request: Request) -> Documents:
    """The app's documents, made on first use with the settings' bounds."""
    state = request.app.state
    if not hasattr(state, "deepl_documents"):
        settings = runtime_of(request).settings
        state.deepl_documents = Documents(
            settings.max_documents_in_flight,
            settings.translated_file_ttl_s,
            settings.translated_files_max_bytes,
        )
    store: Documents = state.deepl_documents
    return store


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest([problem("invalid", (field,), message)])
