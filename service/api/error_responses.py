"""Every failure in one of four JSON shapes: ours, ``{"error": {"type", "message", "limit"?, ...}}``,
LibreTranslate's, ``{"error": "..."}`` (``libretranslate_error``), text-embeddings-inference's,
``{"error", "error_type"}`` (``tei_error``), and DeepL's, ``{"message": "..."}`` (``deepl_error``);
``renderer_for`` picks a path's, for what HTTP itself refuses there (an unknown method or sub-path,
the body's limits) as for its routes' own refusals.

Why a request fails, and its status, is decided once (``service.serving.failures.failure_of``, and
``http_failure`` below for what HTTP itself refuses); a shape only writes it. 5xx answers and
invalid requests carry the request id that the ``X-Request-ID`` header also carries, and an
internal error is logged with it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.schemas.tserve import ErrorBody, ErrorDetail, ErrorResponse
from service.serving.failures import SERVING_ERRORS, Failure, InternalError, Problem, failure_of, problem

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's convention; the client never sees it, the metrics do

Renderer = Callable[[Failure, str | None], JSONResponse]


class ClientDisconnected(Exception):
    """The client went away while its request waited; its queued work has been dropped."""


class BodyTooLarge(StarletteHTTPException):
    """Raised from the request body stream (FastAPI passes HTTPExceptions through unchanged).

    The rest of the body stays unread, so the connection closes after the answer."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes", headers={"Connection": "close"})
        self.limit = limit


class BodyTimeout(StarletteHTTPException):
    """The body did not arrive in time (raised from the body stream, like ``BodyTooLarge``)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408,
            f"request body not complete within {timeout_s:g} s of its headers",
            headers={"Connection": "close"},
        )
        self.limit = timeout_s


class BodyNotUtf8(StarletteHTTPException):
    """A body that is not UTF-8 although it would parse (raised from the body stream)."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            400, f"the request body is not valid UTF-8 ({reason})", headers={"Connection": "close"}
        )
        self.limit = "utf-8"


_HTTP_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "body_too_large",
    415: "unsupported_media_type",
}


def request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


# ---- the two shapes ----------------------------------------------------------------------------


def error_response(failure: Failure, request_id: str | None = None) -> JSONResponse:
    """Our shape; an invalid request lists its problems as ``details``."""
    details = None if failure.problems is None else [_detail(p) for p in failure.problems]
    message, limit = failure.message, failure.limit
    if details is not None:
        message = "; ".join(_describe(d) for d in details[:10])
        message += f"; and {len(details) - 10} more" if len(details) > 10 else ""
        limit = details[0].limit if len(details) == 1 else None
    traced = failure.for_operator or details is not None
    body = ErrorResponse(
        error=ErrorBody(
            type=failure.type,
            message=message,
            limit=limit,
            details=details,
            request_id=request_id if traced else None,
        )
    )
    return JSONResponse(body.model_dump(exclude_none=True), failure.status, headers=dict(failure.headers))


# LibreTranslate's own words for a missing or wrong key, which its clients show.
_LIBRETRANSLATE_KEY_ERRORS = {
    "unauthorized": "an API key is required: send api_key",
    "forbidden": "Invalid API key",
}


def libretranslate_error(failure: Failure, request_id: str | None = None) -> JSONResponse:
    """LibreTranslate's shape and statuses: 400 for any invalid request, 403 for a missing or
    wrong key; ours where it has none (413, 429 with Retry-After, 503, 504)."""
    if failure.type in _LIBRETRANSLATE_KEY_ERRORS:
        return JSONResponse({"error": _LIBRETRANSLATE_KEY_ERRORS[failure.type]}, 403)
    headers = dict(failure.headers)
    if failure.problems is not None:
        return JSONResponse({"error": "Invalid request: " + _listed(failure.problems)}, 400, headers=headers)
    return JSONResponse({"error": failure.message}, failure.status, headers=headers)


# TEI's error types (its ``ErrorType``) of the statuses it answers; the others take the nearest.
_TEI_TYPES = {424: "backend", 429: "overloaded", 503: "unhealthy"}


def tei_error(failure: Failure, request_id: str | None = None) -> JSONResponse:
    """Hugging Face text-embeddings-inference's shape, ``{"error", "error_type"}``, and its
    statuses: 422 ``validation`` for an invalid request, 400 ``empty`` for no inputs, 424
    ``backend`` for an engine failure, 429 ``overloaded``, 503 ``unhealthy``; ours (401, 403, 404,
    413, 415, 504) where TEI has none."""
    status, message, error_type = failure.status, failure.message, "validation"
    if failure.problems is not None:
        empty = all(p.get("type") == "too_short" for p in failure.problems)
        status, message = (400 if empty else 422), _listed(failure.problems)
        error_type = "empty" if empty else "validation"
    else:
        status = 424 if failure.type == "internal_error" else status
        error_type = _TEI_TYPES.get(status, "backend" if status >= 500 else "validation")
    return JSONResponse({"error": message, "error_type": error_type}, status, headers=dict(failure.headers))


# The paths of the APIs whose clients read their own shape: LibreTranslate's web page shows its
# ``error`` as text, and would show ``[object Object]`` for ours. LibreTranslate's: these first
# segments, and whatever lies under them (a path its page or clients may call that this service
# does not serve); DeepL's: everything under /v2/ (ours is /v1/).
_LIBRETRANSLATE_SEGMENTS = frozenset(
    {"translate", "translate_file", "download_file", "detect", "languages", "frontend", "suggest", "spec"}
)
_TEI_PATHS = frozenset({"/", "/embed", "/similarity", "/tokenize", "/decode", "/info"})


def renderer_for(path: str) -> Renderer:
    """The shape the clients of ``path`` read: LibreTranslate's, DeepL's, TEI's, or ours."""
    if _is_libretranslate(path):
        return libretranslate_error
    if path.startswith("/v2/"):
        return deepl_error
    return tei_error if path in _TEI_PATHS else error_response


def _is_libretranslate(path: str) -> bool:
    segments = path.split("/", 2)  # ["", first, rest]
    return len(segments) > 1 and segments[1] in _LIBRETRANSLATE_SEGMENTS


QUOTA_EXCEEDED = 456  # DeepL's status for a spent quota (here: the glossaries' limits)


def deepl_error(failure: Failure, request_id: str | None = None) -> JSONResponse:
    """DeepL's shape and statuses: 403 for a missing or wrong key, 400 for any invalid request,
    456 when the glossaries are full; ours where it has none (404, 413, 429, 503, 504)."""
    headers = dict(failure.headers)
    if failure.type in ("unauthorized", "forbidden"):
        return JSONResponse({"message": f"Authorization failure: {failure.message}"}, 403)
    if failure.problems is not None:
        full = any(p.get("type") == "glossary_full" for p in failure.problems)
        return JSONResponse(
            {"message": _listed(failure.problems)}, QUOTA_EXCEEDED if full else 400, headers=headers
        )
    return JSONResponse({"message": failure.message}, failure.status, headers=headers)


def answer(request: Request, error: Exception, render: Renderer) -> JSONResponse:
    """``error`` (one of ``SERVING_ERRORS``) in ``render``'s shape; an internal error is logged."""
    assert isinstance(error, SERVING_ERRORS)
    rid = request_id(request)
    if isinstance(error, InternalError):
        log.error("request %s: %s", rid, error.message, exc_info=error.__cause__ or error)
    return render(failure_of(error), rid)


def http_failure(exc: StarletteHTTPException) -> Failure:
    """What HTTP itself refuses: the body's limits and encoding, a body FastAPI cannot parse."""
    if _is_number_too_long(exc.__cause__):
        digits = sys.get_int_max_str_digits()
        too_long = problem("number_too_long", (), f"a number has more than {digits} digits", digits)
        return Failure(422, "validation_error", too_long["msg"], problems=[too_long])
    return Failure(
        exc.status_code,
        _HTTP_TYPES.get(exc.status_code, "http_error"),
        _unparsable_body(exc.__cause__) or str(exc.detail),
        exc.limit if isinstance(exc, BodyTooLarge | BodyTimeout | BodyNotUtf8) else None,
        dict(exc.headers or {}),
    )


def _listed(problems: Sequence[Problem]) -> str:
    parts = []
    for found in problems[:10]:
        loc = ".".join(str(p) for p in found.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {found.get('msg')}" if loc else str(found.get("msg")))
    return "; ".join(parts)


def _detail(found: Problem) -> ErrorDetail:
    return ErrorDetail(
        field="body" if found.get("type") == "json_invalid" else _field(found.get("loc", ())),
        message=_message(found),
        type=str(found.get("type")),
        limit=_limit(found),
    )


def _field(loc: Sequence[Any]) -> str:
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _limit(error: Problem) -> float | str | None:
    ctx = error.get("ctx") or {}
    for key in ("limit", "max_length", "min_length", "le", "ge", "lt", "gt"):
        value = ctx.get(key)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return value
    return None


def _describe(detail: ErrorDetail) -> str:
    text = f"{detail.field}: {detail.message}"
    if detail.limit is not None and str(detail.limit) not in detail.message:
        text += f" (limit {detail.limit})"
    return text


_NOT_AN_OBJECT = ("model_attributes_type", "model_type", "dict_type")


def _message(error: Problem) -> str:
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    if error.get("type") in _NOT_AN_OBJECT:
        return "expected a JSON object"
    if error.get("type") == "json_invalid":
        loc = error.get("loc", ())
        at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        reason = str((error.get("ctx") or {}).get("error", "decode error")).removesuffix(" at")
        return f"invalid JSON{at}: {reason}"
    return str(error.get("msg", "invalid"))


def is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _on_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = exc.errors()
    content_type = request.headers.get("content-type", "")
    if not is_json(content_type) and any(
        p.get("type") in _NOT_AN_OBJECT and tuple(p.get("loc", ())) == ("body",) for p in problems
    ):
        # FastAPI leaves a non-JSON body unparsed, which would read as "expected a JSON object".
        got = repr(content_type) if content_type else "none"
        message = f"send the body as JSON with 'Content-Type: application/json' (got {got})"
        return _render(request, Failure(415, "unsupported_media_type", message, "application/json"))
    return _render(request, Failure(422, "validation_error", "", problems=problems))


def _render(request: Request, failure: Failure) -> JSONResponse:
    return renderer_for(request.scope["path"])(failure, request_id(request))


async def _on_serving_error(request: Request, exc: Exception) -> Response:
    return answer(request, exc, renderer_for(request.scope["path"]))


async def _on_disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _render(request, http_failure(exc))


def _is_number_too_long(cause: BaseException | None) -> bool:
    """Python's guard against quadratic int parsing, hit by ``json.loads`` on a huge integer."""
    return (
        type(cause) is ValueError
        and "integer string conversion" in str(cause)  # not its subclasses (JSON, Unicode errors)
    )


def _unparsable_body(cause: BaseException | None) -> str | None:
    """What FastAPI's generic 400 "error parsing the body" was, when a client can fix it."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not valid UTF-8 (invalid byte at position {cause.start})"
    if isinstance(cause, RecursionError):
        return "the request body's JSON is nested too deeply"
    return None


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    rid = request_id(request)
    log.error("request %s: unhandled %s", rid, type(exc).__name__, exc_info=exc)
    # a 500 in the path's shape, but for TEI's, which would make it an engine's 424
    path = request.scope["path"]
    render = error_response if path in _TEI_PATHS else renderer_for(path)
    return render(Failure(500, "internal_error", "internal server error"), rid)


# How a request's own failures are answered, wherever its route runs (the router, the hot path).
# Any other exception is a bug: the server-error layer answers it (``_on_unexpected``).
REQUEST_ERROR_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    RequestValidationError: _on_validation,
    **{kind: _on_serving_error for kind in SERVING_ERRORS},
    ClientDisconnected: _on_disconnected,
    StarletteHTTPException: _on_http,
}


def install_error_handlers(app: FastAPI) -> None:
    for kind, handler in REQUEST_ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.add_exception_handler(Exception, _on_unexpected)


def documented(model: type[BaseModel], descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route: each status with its body model and description."""
    return {status: {"model": model, "description": text} for status, text in descriptions.items()}


# Documented in OpenAPI on every model route.
ERROR_RESPONSES = documented(
    ErrorResponse,
    {
        400: "Body not parsable (not UTF-8, or JSON nested too deeply)",
        401: "API key missing",
        403: "API key wrong",
        404: "Model not served (an unknown model name, or the task is not configured)",
        408: "Request body not complete in time (TSERVE_BODY_TIMEOUT_S)",
        413: "Request body too large",
        415: "Body not sent as JSON (Content-Type: application/json)",
        422: "Invalid request (field, reason and limit in the body)",
        429: "Queue full; retry after the Retry-After header's seconds",
        500: "Internal error (the body carries the request id)",
        503: "Not ready yet, or shutting down",
        504: "Deadline exceeded",
    },
)
# GET routes behind the key: no body to validate, no queue.
GATED_RESPONSES: dict[int | str, dict[str, Any]] = {s: ERROR_RESPONSES[s] for s in (401, 403, 503)}
