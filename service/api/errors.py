"""Every failure becomes one JSON shape, ``{"error": {"type", "message", "limit"?, ...}}``.

The status says who should act: 4xx the client (fix the request, or slow down for 429),
5xx the operator (503 not ready or shutting down, 504 deadline, 500 a bug: logged with the
request id that the body and the ``X-Request-ID`` header also carry).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.schemas import ErrorBody, ErrorDetail, ErrorResponse
from service.engine.base import TextTooLong
from service.queue import BatcherClosed, DeadlineExceeded, DecodeTooLarge, EngineFailure, QueueFull

log = logging.getLogger(__name__)

R = TypeVar("R")

CLIENT_CLOSED_REQUEST = 499  # nginx's convention; the client never sees it, the metrics do


class ServiceError(Exception):
    status_code = 500
    type = "internal_error"

    def __init__(
        self, message: str, *, limit: float | str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.headers = headers or {}


class NotReady(ServiceError):
    status_code = 503
    type = "not_ready"


class ShuttingDown(ServiceError):
    status_code = 503
    type = "shutting_down"


class ModelNotFound(ServiceError):
    status_code = 404
    type = "model_not_found"


class Unauthorized(ServiceError):
    status_code = 401
    type = "unauthorized"


class Forbidden(ServiceError):
    status_code = 403
    type = "forbidden"


class InternalError(ServiceError):
    """A server-side failure the client cannot fix (engine crash, a bad item we did not expect)."""


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


def error_response(
    status: int,
    type_: str,
    message: str,
    *,
    limit: float | str | None = None,
    details: list[ErrorDetail] | None = None,
    request_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(
        error=ErrorBody(type=type_, message=message, limit=limit, details=details, request_id=request_id)
    )
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


def validation_error(errors: Sequence[dict[str, Any]]) -> RequestValidationError:
    """A 422 in the same shape as pydantic's own (for checks that need the loaded model or settings)."""
    return RequestValidationError(list(errors))


def unpack_results(results: Sequence[R | Exception], field: str) -> list[R]:
    """All results, or the request's error: 422 naming every text that is too long (or whose
    decoding could never fit the decode memory budget), else 500.

    All-or-nothing keeps the response arrays aligned with the request's (see ``schemas``).
    """
    refused = [(i, r) for i, r in enumerate(results) if isinstance(r, TextTooLong | DecodeTooLarge)]
    if refused:
        raise validation_error(
            [
                {
                    "type": "text_too_long" if isinstance(r, TextTooLong) else "decode_too_large",
                    "loc": ("body", field, i),
                    "msg": str(r),
                    "ctx": {"limit": r.limit},
                }
                for i, r in refused
            ]
        )
    for i, result in enumerate(results):
        if isinstance(result, EngineFailure):
            raise InternalError(str(result)) from result
        if isinstance(result, Exception):
            raise InternalError(f"{field}[{i}] failed: {type(result).__name__}") from result
    return [r for r in results if not isinstance(r, Exception)]


def _field(loc: Sequence[Any]) -> str:
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _limit(error: dict[str, Any]) -> float | str | None:
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


def _message(error: dict[str, Any]) -> str:
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
    errors = exc.errors()
    content_type = request.headers.get("content-type", "")
    if not is_json(content_type) and any(
        e.get("type") in _NOT_AN_OBJECT and tuple(e.get("loc", ())) == ("body",) for e in errors
    ):
        # FastAPI leaves a non-JSON body unparsed, which would read as "expected a JSON object".
        return error_response(
            415,
            "unsupported_media_type",
            "send the body as JSON with 'Content-Type: application/json' "
            f"(got {repr(content_type) if content_type else 'none'})",
            limit="application/json",
        )
    details = [
        ErrorDetail(
            field="body" if e.get("type") == "json_invalid" else _field(e.get("loc", ())),
            message=_message(e),
            type=str(e.get("type")),
            limit=_limit(e),
        )
        for e in errors
    ]
    shown = "; ".join(_describe(d) for d in details[:10])
    more = f"; and {len(details) - 10} more" if len(details) > 10 else ""
    return error_response(
        422,
        "validation_error",
        shown + more,
        limit=details[0].limit if len(details) == 1 else None,
        details=details,
        request_id=request_id(request),
    )


async def _on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    rid = request_id(request) if exc.status_code >= 500 else None
    if isinstance(exc, InternalError):
        log.error("request %s: %s", rid, exc.message, exc_info=exc.__cause__ or exc)
    return error_response(
        exc.status_code, exc.type, exc.message, limit=exc.limit, request_id=rid, headers=exc.headers
    )


async def _on_queue_full(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, QueueFull)
    return error_response(
        429, "queue_full", str(exc), limit=exc.limit, headers={"Retry-After": str(exc.retry_after_s)}
    )


async def _on_deadline(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DeadlineExceeded)
    return error_response(
        504, "deadline_exceeded", str(exc), limit=exc.timeout_s, request_id=request_id(request)
    )


async def _on_closed(request: Request, exc: Exception) -> Response:
    return error_response(503, "shutting_down", str(exc), headers={"Connection": "close"})


async def _on_disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if _is_number_too_long(exc.__cause__):
        return _number_too_long(request)
    limit = exc.limit if isinstance(exc, BodyTooLarge | BodyTimeout | BodyNotUtf8) else None
    return error_response(
        exc.status_code,
        _HTTP_TYPES.get(exc.status_code, "http_error"),
        _unparsable_body(exc.__cause__) or str(exc.detail),
        limit=limit,
        headers=dict(exc.headers or {}),
    )


def _is_number_too_long(cause: BaseException | None) -> bool:
    """Python's guard against quadratic int parsing, hit by ``json.loads`` on a huge integer."""
    return (
        type(cause) is ValueError
        and "integer string conversion" in str(cause)  # not its subclasses (JSON, Unicode errors)
    )


def _number_too_long(request: Request) -> Response:
    digits = sys.get_int_max_str_digits()
    detail = ErrorDetail(
        field="body", message=f"a number has more than {digits} digits", type="number_too_long", limit=digits
    )
    return error_response(
        422,
        "validation_error",
        _describe(detail),
        limit=digits,
        details=[detail],
        request_id=request_id(request),
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
    return error_response(500, "internal_error", "internal server error", request_id=rid)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(QueueFull, _on_queue_full)
    app.add_exception_handler(DeadlineExceeded, _on_deadline)
    app.add_exception_handler(BatcherClosed, _on_closed)
    app.add_exception_handler(ClientDisconnected, _on_disconnected)
    app.add_exception_handler(StarletteHTTPException, _on_http)
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
