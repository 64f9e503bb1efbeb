"""The one mapping of why a request is not served to a ``Failure`` (status, kind, limit, headers)."""

from __future__ import annotations

import pytest

from service.engine.base import TextTooLong
from service.queue import DeadlineExceeded, DecodeTooLarge, EngineFailure, QueueClosed, QueueFull
from service.serving.failures import (
    SERVING_ERRORS,
    Failure,
    Forbidden,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    ServiceError,
    ShuttingDown,
    Unauthorized,
    UnsupportedMediaType,
    failure_of,
    problem,
)
from service.serving.routing import UnservedLanguages
from service.serving.submit import all_or_nothing


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            QueueFull("m", 8, 3),
            Failure(429, "queue_full", "m: queue full (8 items); retry after 3 s", 8, {"Retry-After": "3"}),
        ),
        (
            DeadlineExceeded("m", 0.5),
            Failure(504, "deadline_exceeded", "m: no result within the request deadline of 0.5 s", 0.5),
        ),
        (
            QueueClosed("m: closed"),
            Failure(503, "shutting_down", "m: closed", headers={"Connection": "close"}),
        ),
        (
            NotReady("not ready (loading)", headers={"Retry-After": "5"}),
            Failure(503, "not_ready", "not ready (loading)", headers={"Retry-After": "5"}),
        ),
        (ShuttingDown("bye"), Failure(503, "shutting_down", "bye")),
        (ModelNotFound("no such model"), Failure(404, "model_not_found", "no such model")),
        (Unauthorized("missing"), Failure(401, "unauthorized", "missing")),
        (Forbidden("wrong"), Failure(403, "forbidden", "wrong")),
        (UnsupportedMediaType("send JSON"), Failure(415, "unsupported_media_type", "send JSON")),
        (InternalError("engine crashed"), Failure(500, "internal_error", "engine crashed")),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
def test_each_reason_has_its_status_kind_limit_and_headers(error: Exception, expected: Failure) -> None:
    assert isinstance(error, SERVING_ERRORS)
    assert failure_of(error) == expected


def test_operator_failures_are_the_5xx() -> None:
    assert failure_of(InternalError("x")).for_operator and failure_of(DeadlineExceeded("m", 1)).for_operator
    assert not failure_of(QueueFull("m", 8, 1)).for_operator and not failure_of(Forbidden("x")).for_operator


def test_an_invalid_request_is_422_carrying_its_problems() -> None:
    problems = [
        problem("too_long", ("text",), "at most 8 texts", 8),
        problem("html_invalid", ("text", 2), "bad tag"),
    ]
    failure = failure_of(InvalidRequest(problems, headers={"Connection": "close"}))
    assert (failure.status, failure.type, failure.headers) == (
        422,
        "validation_error",
        {"Connection": "close"},
    )
    assert failure.problems == [
        {"type": "too_long", "loc": ("body", "text"), "msg": "at most 8 texts", "ctx": {"limit": 8}},
        {"type": "html_invalid", "loc": ("body", "text", 2), "msg": "bad tag"},
    ]


def test_a_subclass_keeps_its_parents_status_unless_it_names_its_own() -> None:
    unserved = UnservedLanguages("pair", "en", "en", "en→de", [])
    assert (unserved.status_code, unserved.type) == (422, "validation_error")
    assert (InternalError.status_code, ServiceError.status_code) == (500, 500)


def test_results_are_all_or_nothing() -> None:
    assert all_or_nothing(["a", "b"], "text") == ["a", "b"]
    too_long = TextTooLong("text has 40 tokens, more than 16", 16)
    too_large = DecodeTooLarge("needs 2 GiB", 1024)
    with pytest.raises(InvalidRequest) as refused:
        all_or_nothing(["a", too_long, RuntimeError("x"), too_large], "texts")
    assert refused.value.problems == [  # every refused text named, before any other failure
        problem("text_too_long", ("texts", 1), str(too_long), 16),
        problem("decode_too_large", ("texts", 3), str(too_large), 1024),
    ]
    with pytest.raises(InternalError, match=r"^texts\[1\] failed: RuntimeError$"):
        all_or_nothing(["a", RuntimeError("secret detail")], "texts")
    with pytest.raises(InternalError, match="m: engine failed"):
        all_or_nothing([EngineFailure("m: engine failed")], "texts")
