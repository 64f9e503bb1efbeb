"""File translation over HTTP (``service/files``): LibreTranslate's ``POST /translate_file`` and
``GET /download_file/{name}``, and ``POST /v1/translate/file``.

LibreTranslate's answers ``{"translatedFileUrl": ...}``, the URL of ``/download_file/<name>``
where the translated file waits (``service/files/downloads.py``), as its clients expect; its key may
come in the form, the query or as a bearer token, and its errors have its shape. ``/v1``'s
answers the translated file itself, with its content type and the uploaded name.
"""

from __future__ import annotations

from typing import Annotated, Protocol
from urllib.parse import quote

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi import Path as PathParam
from starlette.datastructures import UploadFile as StarletteUpload
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.api.dependencies import HttpClient, bearer_token, require_api_key, runtime_of
from service.api.error_responses import (
    ERROR_RESPONSES,
    answer,
    documented,
    http_failure,
    libretranslate_error,
)
from service.api.schemas.libretranslate import LibreTranslateErrorBody
from service.files.downloads import STORED_NAME_MAX_CHARS, TranslatedFiles
from service.files.registry import FileRequest, translate_file
from service.serving.access import check_api_key, ready
from service.serving.failures import SERVING_ERRORS, InvalidRequest, problem

router = APIRouter(tags=["files"])

_MAX_FORM_FIELDS = 8


@router.post(
    "/v1/translate/file",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The translated file"},
        **ERROR_RESPONSES,
    },
    dependencies=[Depends(require_api_key)],
)
async def translate_v1_file(
    request: Request,
    file: Annotated[UploadFile, File(description="A .txt, .md, .srt, .html, … file")],
    target_language: Annotated[str | None, Form(max_length=16)] = None,
    source_language: Annotated[str | None, Form(max_length=16)] = None,
    model: Annotated[str | None, Form(max_length=128)] = None,
) -> Response:
    """The file translated, in its own format (its structure kept; docs/api.md says how)."""
    asked = FileRequest(
        filename=file.filename or "",
        data=await file.read(),
        source=source_language,
        target=target_language,
        model=model,
        api_key=bearer_token(request),  # checked by require_api_key before the route runs
    )
    done = await translate_file(ready(runtime_of(request)), HttpClient(request), asked)
    return Response(
        done.data,
        media_type=done.media_type,
        headers={
            "Content-Disposition": attachment(done.filename),
            "Content-Language": done.target_language,
            "X-Translation-Model": done.model,
        },
    )


# The form is read by hand (LibreTranslate's field names and error shape); declared for OpenAPI.
_LIBRETRANSLATE_FILE_FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "source", "target"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "source": {"type": "string", "maxLength": 16, "description": 'or "auto"'},
                        "target": {"type": "string", "maxLength": 16},
                        "api_key": {"type": "string", "maxLength": 256},
                    },
                }
            }
        },
    }
}


_LIBRETRANSLATE_ERRORS = documented(
    LibreTranslateErrorBody,
    {
        400: "Invalid request (a field missing, the file not what its extension says, ...)",
        403: "API key missing or wrong",
        413: "File, or its text, too large",
        415: "A file format not translated",
        429: "Queue full, or the key over its quota; retry after the Retry-After header's seconds",
        500: "Internal error",
        503: "Not ready yet, or shutting down",
        504: "Deadline exceeded",
    },
)


@router.post(
    "/translate_file",
    tags=["libretranslate"],
    openapi_extra=_LIBRETRANSLATE_FILE_FORM,
    responses=_LIBRETRANSLATE_ERRORS,
)
async def translate_libretranslate_file(request: Request) -> Response:
    """LibreTranslate's file translation: multipart ``file``, ``source`` (or "auto"), ``target``,
    ``api_key``; answers the translated file's download URL."""
    runtime = runtime_of(request)
    try:
        form = await request.form(max_files=1, max_fields=_MAX_FORM_FIELDS)
        fields = {key: value for key, value in form.items() if isinstance(value, str)}
        key = check_api_key(runtime.settings.api_keys, _offered_keys(request, fields.get("api_key")))
        upload = form.get("file")
        if not isinstance(upload, StarletteUpload):
            raise _missing("file")
        source, target = fields.get("source"), fields.get("target")
        if not source:
            raise _missing("source")
        if not target:
            raise _missing("target")
        asked = FileRequest(
            filename=upload.filename or "",
            data=await upload.read(),
            source=source,
            target=target,
            first_of_several=True,  # its clients cannot name a model
            api_key=key,
        )
        done = await translate_file(ready(runtime), HttpClient(request), asked)
        name = _store(request).put(done.filename, done.media_type, done.data)
    except HTTPException as e:  # the body's and the form parser's limits
        return libretranslate_error(http_failure(e))
    except SERVING_ERRORS as e:
        return answer(request, e, libretranslate_error)
    return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", filename=name))})


@router.get(
    "/download_file/{filename}",
    tags=["libretranslate"],
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The translated file"},
        **documented(
            LibreTranslateErrorBody,
            {400: "Not a name the service gives", 404: "No such file: it expired or was never translated"},
        ),
    },
)
async def download_file(
    request: Request, filename: Annotated[str, PathParam(max_length=STORED_NAME_MAX_CHARS)]
) -> Response:
    """A file ``/translate_file`` translated, while it is kept (``TSERVE_TRANSLATED_FILE_TTL_S``)."""
    if "/" in filename or "\\" in filename or filename.startswith("."):
        return JSONResponse({"error": "Invalid filename"}, 400)
    stored = _store(request).get(filename)
    if stored is None:
        return JSONResponse({"error": "No such file: it expired or was never translated"}, 404)
    return download(stored)


class Downloadable(Protocol):
    @property
    def data(self) -> bytes: ...
    @property
    def media_type(self) -> str: ...
    @property
    def filename(self) -> str: ...


def download(file: Downloadable) -> Response:
    """A translated file as the body of a download, under its own name."""
    headers = {"Content-Disposition": attachment(file.filename)}
    return Response(file.data, media_type=file.media_type, headers=headers)


def _store(request: Request) -> TranslatedFiles:
    """The app's download store, made on first use with the settings' bounds."""
    state = request.app.state
    if not hasattr(state, "translated_files"):
        settings = runtime_of(request).settings
        state.translated_files = TranslatedFiles(
            settings.translated_file_ttl_s, settings.translated_files_max_bytes
        )
    store: TranslatedFiles = state.translated_files
    return store


def _offered_keys(request: Request, form_key: str | None) -> list[str | None]:
    return [form_key, request.query_params.get("api_key"), bearer_token(request)]


def _missing(field: str) -> InvalidRequest:
    return InvalidRequest([problem("missing", (field,), f"missing {field} parameter")])


def attachment(filename: str) -> str:
    """A Content-Disposition naming the uploaded file (RFC 6266: ASCII fallback, UTF-8 name)."""
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{ascii_name or 'file'}\"; filename*=UTF-8''{quote(filename)}"
