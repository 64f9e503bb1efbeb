"""One failure, two shapes: ours and LibreTranslate's, each with the same status and headers
except where LibreTranslate has statuses and words of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.responses import JSONResponse

from service.api.error_responses import error_response, libretranslate_error
from service.queue import QueueFull
from service.serving.failures import Failure, Forbidden, InvalidRequest, Unauthorized, failure_of, problem


def body(response: JSONResponse) -> Any:
    return json.loads(bytes(response.body))


@pytest.mark.parametrize(
    "failure",
    [
        failure_of(QueueFull("m", 8, 3)),
        Failure(504, "deadline_exceeded", "m: too late", 0.5),
        Failure(503, "not_ready", "not ready (loading)", headers={"Retry-After": "5"}),
        Failure(413, "body_too_large", "request body larger than 1024 bytes", 1024, {"Connection": "close"}),
    ],
    ids=lambda f: f.type,
)
def test_both_shapes_answer_with_the_same_status_and_headers(failure: Failure) -> None:
    ours, theirs = error_response(failure, "rid-1"), libretranslate_error(failure, "rid-1")
    assert ours.status_code == theirs.status_code == failure.status
    for name, value in failure.headers.items():
        assert ours.headers[name] == theirs.headers[name] == value
    assert body(theirs) == {"error": failure.message}
    error = body(ours)["error"]
    assert (error["type"], error["message"], error.get("limit")) == (
        failure.type,
        failure.message,
        failure.limit,
    )


def test_the_request_id_goes_with_5xx_and_invalid_requests_only() -> None:
    assert (
        body(error_response(Failure(504, "deadline_exceeded", "late"), "rid"))["error"]["request_id"] == "rid"
    )
    assert body(error_response(Failure(503, "shutting_down", "bye"), "rid"))["error"]["request_id"] == "rid"
    assert "request_id" not in body(error_response(failure_of(QueueFull("m", 8, 3)), "rid"))["error"]
    invalid = failure_of(InvalidRequest([problem("too_long", ("text",), "at most 8 texts", 8)]))
    assert body(error_response(invalid, "rid"))["error"]["request_id"] == "rid"


def test_an_invalid_request_is_a_422_with_details_or_libretranslates_400() -> None:
    problems = [
        problem("string_too_long", ("q", 1), "text has 201 characters, more than 200", 200),
        problem("html_invalid", ("q", 2), "unclosed <p>"),
    ]
    failure = failure_of(InvalidRequest(problems))
    ours = error_response(failure, "rid")
    assert ours.status_code == 422
    assert body(ours)["error"] == {
        "type": "validation_error",
        "message": "q[1]: text has 201 characters, more than 200; q[2]: unclosed <p>",
        "details": [
            {
                "field": "q[1]",
                "message": "text has 201 characters, more than 200",
                "type": "string_too_long",
                "limit": 200,
            },
            {"field": "q[2]", "message": "unclosed <p>", "type": "html_invalid"},
        ],
        "request_id": "rid",
    }
    theirs = libretranslate_error(failure)
    assert theirs.status_code == 400
    assert body(theirs) == {
        "error": "Invalid request: q.1: text has 201 characters, more than 200; q.2: unclosed <p>"
    }


def test_a_missing_or_wrong_key_is_libretranslates_403_in_its_words() -> None:
    missing = failure_of(Unauthorized("missing API key", headers={"WWW-Authenticate": "Bearer"}))
    assert error_response(missing).status_code == 401
    assert error_response(missing).headers["WWW-Authenticate"] == "Bearer"
    theirs = libretranslate_error(missing)
    assert (theirs.status_code, body(theirs)) == (403, {"error": "an API key is required: send api_key"})
    assert "www-authenticate" not in theirs.headers
    wrong = libretranslate_error(failure_of(Forbidden("invalid API key")))
    assert (wrong.status_code, body(wrong)) == (403, {"error": "Invalid API key"})
