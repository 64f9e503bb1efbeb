"""Hand-written hostile inputs over real HTTP (uvicorn, default limits): each is a clear 4xx in the
one error shape, with a message that says what to fix, nothing reaches an engine, and the server
keeps serving. Empty and whitespace-only texts, beam size 0, over-long and surplus items at the
configured limits, unknown languages and unknown fields of /v1/translate and /v1/embed are
covered in tests/service/api (test_api_translate.py, test_api_embed.py); this adds what needs
real bytes on the wire or sizes far past the limits.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.settings import HARD_MAX_CHARS, HARD_MAX_ITEMS, Settings
from tests.servers import ServerProcess

JSON = "application/json"
DEFAULTS = Settings()  # the server runs with the default limits


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


# (id, path, body, content type, status, error type, field or None, message fragment, limit or None)
CASES: list[tuple[str, str, bytes, str | None, int, str, str | None, str, Any]] = [
    (
        "invalid-utf8",
        "/v1/embed",
        b'{"texts": ["caf\xe9 \xff"]}',
        JSON,
        400,
        "bad_request",
        None,
        "UTF-8",
        None,
    ),
    (
        "lone-surrogate",
        "/v1/translate",
        b'{"text": "a \\ud800 b"}',
        JSON,
        422,
        "validation_error",
        "text[0]",
        "unicode",
        None,
    ),
    (
        "nul-escaped",
        "/v1/embed",
        b'{"texts": ["a\\u0000b"]}',
        JSON,
        422,
        "validation_error",
        "texts[0]",
        "NUL",
        None,
    ),
    (
        "nul-raw-byte",
        "/v1/embed",
        b'{"texts": ["a\x00b"]}',
        JSON,
        422,
        "validation_error",
        "body",
        "invalid JSON",
        None,
    ),
    (
        "one-megabyte-text",
        "/v1/embed",
        _json({"texts": ["x" * 1_000_000]}),
        JSON,
        422,
        "validation_error",
        "texts[0]",
        f"at most {HARD_MAX_CHARS} characters",
        HARD_MAX_CHARS,
    ),
    (
        "body-over-the-limit",
        "/v1/embeddings",
        _json({"input": "x" * (DEFAULTS.max_body_bytes + 1)}),
        JSON,
        413,
        "body_too_large",
        None,
        f"larger than {DEFAULTS.max_body_bytes} bytes",
        DEFAULTS.max_body_bytes,
    ),
    (
        "ten-thousand-items",
        "/v1/embed",
        _json({"texts": ["x"] * 10_000}),
        JSON,
        422,
        "validation_error",
        "texts",
        f"at most {HARD_MAX_ITEMS} items",
        HARD_MAX_ITEMS,
    ),
    (
        "items-over-the-configured-limit",
        "/v1/embeddings",
        _json({"input": ["x"] * (DEFAULTS.max_items_per_request + 1)}),
        JSON,
        422,
        "validation_error",
        "input",
        f"at most {DEFAULTS.max_items_per_request} texts",
        DEFAULTS.max_items_per_request,
    ),
    (
        "nested-ten-thousand-deep",
        "/v1/embed",
        b'{"texts": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        JSON,
        400,
        "bad_request",
        None,
        "nested too deeply",
        None,
    ),
    (
        "nested-shallow",
        "/v1/embed",
        b'{"texts": [[["x"]]]}',
        JSON,
        422,
        "validation_error",
        "texts[0]",
        "string",
        None,
    ),
    (
        "text-plain",
        "/v1/embed",
        _json({"texts": ["x"]}),
        "text/plain",
        415,
        "unsupported_media_type",
        None,
        "application/json",
        "application/json",
    ),
    (
        "form",
        "/v1/translate",
        b"text=hello",
        "application/x-www-form-urlencoded",
        415,
        "unsupported_media_type",
        None,
        "application/json",
        "application/json",
    ),
    (
        "no-content-type",
        "/v1/embeddings",
        _json({"input": "x"}),
        None,
        415,
        "unsupported_media_type",
        None,
        "got none",
        "application/json",
    ),
    (
        "json-array",
        "/v1/embed",
        b'["x"]',
        JSON,
        422,
        "validation_error",
        "body",
        "expected a JSON object",
        None,
    ),
    (
        "json-null",
        "/v1/translate",
        b"null",
        JSON,
        422,
        "validation_error",
        "body",
        "expected a JSON object",
        None,
    ),
    ("empty-body", "/v1/translate", b"", JSON, 422, "validation_error", "body", "Field required", None),
    (
        "beam-1000",
        "/v1/translate",
        _json({"text": "hi", "beam_size": 1000}),
        JSON,
        422,
        "validation_error",
        "beam_size",
        "less than or equal to 8",
        8,
    ),
    (
        "max-length-negative",
        "/v1/translate",
        _json({"text": "hi", "max_length": -5}),
        JSON,
        422,
        "validation_error",
        "max_length",
        "greater than or equal to 1",
        1,
    ),
    (
        "max-length-huge",
        "/v1/translate",
        b'{"text": "hi", "max_length": 1' + b"0" * 400 + b"}",
        JSON,
        422,
        "validation_error",
        "max_length",
        "less than or equal to 512",
        512,
    ),
    (
        "beam-float",
        "/v1/translate",
        _json({"text": "hi", "beam_size": 4.0}),
        JSON,
        422,
        "validation_error",
        "beam_size",
        "valid integer",
        None,
    ),
    (
        "penalty-nan",
        "/v1/translate",
        b'{"text": "hi", "length_penalty": NaN}',
        JSON,
        422,
        "validation_error",
        "length_penalty",
        "length_penalty",
        None,
    ),
    (
        "language-injection",
        "/v1/translate",
        _json({"text": "hi", "target_language": "de'; --"}),
        JSON,
        422,
        "validation_error",
        "target_language",
        "pattern",
        None,
    ),
    (
        "embeddings-unknown-field",
        "/v1/embeddings",
        _json({"input": "x", "temperature": 1}),
        JSON,
        422,
        "validation_error",
        "temperature",
        "unknown field",
        None,
    ),
    (
        "embeddings-dimensions",
        "/v1/embeddings",
        _json({"input": "x", "dimensions": 10**12}),
        JSON,
        422,
        "validation_error",
        "dimensions",
        "65536",
        65536,
    ),
]


@pytest.mark.parametrize(
    "path, body, content_type, status, kind, field, fragment, limit",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_bad_input_is_a_clear_4xx(
    small_server: ServerProcess,
    path: str,
    body: bytes,
    content_type: str | None,
    status: int,
    kind: str,
    field: str | None,
    fragment: str,
    limit: Any,
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    computed = small_server.metric("tserve_batch_size_count", model="small-embed") + small_server.metric(
        "tserve_batch_size_count", model="small-translate"
    )
    r = httpx.post(f"{small_server.url}{path}", content=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == JSON and r.headers["X-Request-ID"]
    error = r.json()["error"]
    assert error["type"] == kind, error
    assert fragment.lower() in error["message"].lower(), error
    if field is not None:
        assert field in [d["field"] for d in error["details"]], error
        assert error["message"].startswith(field), error
    if limit is not None:
        assert error["limit"] == limit, error
    after = small_server.metric("tserve_batch_size_count", model="small-embed") + small_server.metric(
        "tserve_batch_size_count", model="small-translate"
    )
    assert after == computed, "a refused request reached an engine"


def test_wrong_methods_and_paths_are_json_errors(small_server: ServerProcess) -> None:
    r = httpx.get(f"{small_server.url}/v1/embed", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert r.json()["error"]["type"] == "method_not_allowed"
    r = httpx.post(f"{small_server.url}/v1/embed/../../etc/passwd", json={"texts": ["x"]}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"


def test_the_server_still_serves_after_the_bad_inputs(small_server: ServerProcess) -> None:
    for _, path, body, content_type, *_ in CASES:
        httpx.post(
            f"{small_server.url}{path}",
            content=body,
            headers={"Content-Type": content_type} if content_type else {},
            timeout=30,
        )
    assert small_server.proc.poll() is None
    assert httpx.get(f"{small_server.url}/health/ready", timeout=10).status_code == 200
    r = httpx.post(f"{small_server.url}/v1/translate", json={"text": "still here"}, timeout=10)
    assert r.status_code == 200 and r.json()["translations"][0]["hypotheses"][0]["text"] == "HERE still"
    assert "Traceback" not in small_server.log()
