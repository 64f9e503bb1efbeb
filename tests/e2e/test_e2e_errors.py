"""Refusals of the real service over real HTTP: 422 naming the field, 413, the all-or-nothing
contract for lists (service/api/schemas/tserve.py), 404 for an unknown model, and 429 / 504 from a
second server whose queue holds one item and whose deadline is shorter than its batching window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.settings import Settings
from tests.e2e.real_models import EMBEDDER, TRANSLATOR, served_env, start_service
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

DEFAULTS = Settings.model_construct()  # what the fp32 server runs with (no TSERVE_* overrides)
MAX_ITEMS = DEFAULTS.max_items_per_request
MAX_CHARS = DEFAULTS.max_chars_per_text
# Under the character limit, over the models' 256 tokens.
OVER_LONG = " ".join(["A dog runs across a wide green field."] * 60)

T, E, OAI = "/v1/translate", "/v1/embed", "/v1/embeddings"
# (path, body, field, error type, a piece of the message)
INVALID: list[tuple[str, dict[str, Any], str, str, str]] = [
    (T, {"text": ""}, "text[0]", "blank_text", "must not be empty"),
    (T, {"text": ["A dog.", "  "]}, "text[1]", "blank_text", "must not be empty"),
    (T, {"text": ["A dog."] * (MAX_ITEMS + 1)}, "text", "too_long", f"at most {MAX_ITEMS}"),
    (T, {"text": "a" * (MAX_CHARS + 1)}, "text[0]", "string_too_long", f"{MAX_CHARS}"),
    (T, {"text": 5}, "text", "text_type", "string or a list of strings"),
    (T, {"text": "A dog.", "beam_size": "4"}, "beam_size", "int_type", "valid integer"),
    (T, {"text": "A dog.", "beam": 4}, "beam", "extra_forbidden", "unknown field"),
    (T, {"text": "A dog.", "beam_size": 2, "n_best": 3}, "n_best", "n_best_over_beam", "beam_size"),
    (T, {"text": "A dog.", "target_language": "fr"}, "target_language", "unsupported_language_pair", "en→de"),
    (T, {"beam_size": 4}, "text", "missing", "required"),
    (E, {"texts": "A dog."}, "texts", "list_type", "valid list"),
    (E, {"texts": []}, "texts", "too_short", "at least 1"),
    (E, {"texts": ["ok"], "normalize": "yes"}, "normalize", "bool_type", "boolean"),
    (OAI, {"input": "ok", "dimensions": 512}, "dimensions", "unsupported_dimensions", "384"),
    (OAI, {"input": "ok", "encoding_format": "hex"}, "encoding_format", "literal_error", "base64"),
]


@pytest.mark.parametrize(
    ("path", "body", "field", "error_type", "message"),
    INVALID,
    ids=[f"{path}:{error_type}" for path, _, _, error_type, _ in INVALID],
)
def test_invalid_requests_are_422_naming_the_field(
    client: httpx.Client, path: str, body: dict[str, Any], field: str, error_type: str, message: str
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error" and error["request_id"]
    assert any(d["field"] == field and d["type"] == error_type for d in error["details"]), error
    assert field in error["message"] and message in error["message"], error["message"]


def test_one_over_long_text_fails_the_whole_embed_list_naming_each_index(client: httpx.Client) -> None:
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    texts = ["A dog runs.", OVER_LONG, "A cat sleeps.", OVER_LONG]
    response = client.post("/v1/embed", json={"texts": texts, "truncate": False})
    assert response.status_code == 422, response.text
    details = response.json()["error"]["details"]
    assert [d["field"] for d in details] == ["texts[1]", "texts[3]"], details
    assert all(d["type"] == "text_too_long" for d in details)
    assert all(d["limit"] == cards[EMBEDDER]["max_input_tokens"] for d in details)


def test_over_long_texts_are_translated_in_pieces_not_refused(client: httpx.Client) -> None:
    response = client.post("/v1/translate", json={"text": ["A dog runs.", OVER_LONG], "beam_size": 1})
    assert response.status_code == 200, response.text
    long_one = response.json()["translations"][1]
    assert len(long_one["sentences"]) == 60  # sixty sentences, each within the model's input
    assert all(s["hypotheses"][0]["text"].strip() for s in long_one["sentences"])


def test_over_long_texts_are_truncated_for_embeddings_by_default(client: httpx.Client) -> None:
    response = client.post("/v1/embed", json={"texts": ["A dog runs.", OVER_LONG]})
    assert response.status_code == 200, response.text
    (card,) = [c for c in client.get("/v1/models").json()["data"] if c["id"] == EMBEDDER]
    assert response.json()["n_tokens"][1] == card["max_input_tokens"]


def test_an_unknown_openai_model_is_404(client: httpx.Client) -> None:
    response = client.post("/v1/embeddings", json={"input": "ok", "model": "text-embedding-3-small"})
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["type"] == "model_not_found" and EMBEDDER in error["message"]


def _oversized_body() -> bytes:
    text = '"' + "A dog runs across a wide green field. " * 100 + '"'
    items = ", ".join([text] * (DEFAULTS.max_body_bytes // len(text) + 1))
    return f'{{"text": [{items}]}}'.encode()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_oversized_body_is_413(client: httpx.Client, chunked: bool) -> None:
    body = _oversized_body()
    assert len(body) > DEFAULTS.max_body_bytes
    # A generator has no length: httpx streams it chunked, so the limit applies while reading.
    content = (body[i : i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    response = client.post("/v1/translate", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "body_too_large" and error["limit"] == DEFAULTS.max_body_bytes


# ---- 429 and 504 -----------------------------------------------------------------------------

DEADLINE_S = 0.75
TIGHT = {
    "TSERVE_EMBED_MODEL": "",  # translation only: a cheaper start
    "TSERVE_MAX_QUEUE": "1",
    "TSERVE_MAX_ITEMS_PER_REQUEST": "1",
    # Whole-batch decoding, where a batch waits up to 1 s for company, longer than any request
    # may wait: a lone request stays queued until its deadline (504), and meanwhile the queue is
    # full (429). (Continuous decoding admits it at once: tests/service/queue/test_continuous.py.)
    "TSERVE_TRANSLATE_BATCHING": "batch",
    "TSERVE_MAX_WAIT_MS": "1000",
    "TSERVE_REQUEST_TIMEOUT_S": str(DEADLINE_S),
}


@pytest.fixture(scope="module")
def tight_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    yield from start_service(
        tmp_path_factory, "service-tight", served_env(default_artefacts, "fp32", **TIGHT)
    )


def _queued(server: ServerProcess) -> bool:
    return server.metric("tserve_queue_depth", model=TRANSLATOR) >= 1


def test_a_full_queue_is_429_and_a_missed_deadline_504(tight_service: ServerProcess) -> None:
    url = f"{tight_service.url}/v1/translate"
    body = {"text": "A man is riding a bicycle."}
    refused = None
    with ThreadPoolExecutor(1) as pool:
        for _ in range(3):  # a retry only if the machine stalls past the first request's deadline
            first = pool.submit(httpx.post, url, json=body, timeout=60)
            deadline = time.monotonic() + 30
            while not _queued(tight_service) and not first.done() and time.monotonic() < deadline:
                time.sleep(0.02)
            second = httpx.post(url, json=body, timeout=60)
            timed_out = first.result()
            if second.status_code == 429:
                refused = second
                break
    assert refused is not None, f"never 429: last {second.status_code} {second.text}"
    error = refused.json()["error"]
    assert error["type"] == "queue_full" and error["limit"] == 1
    assert int(refused.headers["Retry-After"]) >= 1
    assert timed_out.status_code == 504, timed_out.text
    error = timed_out.json()["error"]
    assert error["type"] == "deadline_exceeded" and error["limit"] == DEADLINE_S and error["request_id"]
    assert timed_out.headers["X-Request-ID"] == error["request_id"]
