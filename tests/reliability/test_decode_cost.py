"""One expensive translation request may not hold translation for everyone (``python -m service``'s
server over the small engines, every batch taking 0.5 s): a short request sent while it runs is
answered on the express worker; a client that leaves has every one of its sentences dropped;
a request over the decode-cost cap is refused before it is queued. Each text of the worst request
is 60 words, 4 pieces for the small model (15 words + its end token = its 16-token input)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess, server_process, small_server_command

DELAY_S = 0.5
MODEL = "small-translate"
# The hostile request of the issue: 64 texts of ~600 characters, the widest search.
TEXTS = [" ".join(f"word{i}x{j}" for j in range(60))[:600] for i in range(64)]
WORST = {"text": TEXTS, "beam_size": 8, "n_best": 8, "max_length": 16}


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("decode-cost") / "server.log"
    env = {"TSERVE_REQUEST_TIMEOUT_S": "60", "TSERVE_MAX_BODY_BYTES": str(1 << 20)}
    env["TSERVE_TRANSLATION_CACHE_BYTES"] = "0"  # WORST is sent twice, and must be decoded twice
    with server_process(small_server_command(DELAY_S), env, log) as server:
        yield server


def test_a_one_word_request_is_answered_while_the_worst_request_decodes(slow_server: ServerProcess) -> None:
    with httpx.Client(base_url=slow_server.url, timeout=120) as client:
        worst: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: worst.update(r=client.post("/v1/translate", json=WORST)))
        thread.start()
        time.sleep(1.0)
        start = time.perf_counter()
        short = client.post("/v1/translate", json={"text": "Hello."})
        waited = time.perf_counter() - start
        assert short.status_code == 200
        assert waited < 2.0, f"the one-word request waited {waited:.1f} s"
        assert thread.is_alive(), "the worst request should still be decoding"
        thread.join()
        assert worst["r"].status_code == 200


def test_a_client_that_leaves_has_all_its_sentences_dropped(slow_server: ServerProcess) -> None:
    """Every sentence of the request is either in a batch that ran or dropped, and the rest of the
    request never runs: how many batches ran before the server saw the client leave depends on
    the machine's load, so that is not counted."""
    dropped_before = slow_server.metric("tserve_dropped_total", model=MODEL, reason="disconnected")
    ran_before = slow_server.metric("tserve_batch_size_sum", model=MODEL)
    with pytest.raises(httpx.TimeoutException), httpx.Client(base_url=slow_server.url, timeout=1.0) as client:
        client.post("/v1/translate", json=WORST)  # leaves after 1 s: a few batches ran
    deadline = time.monotonic() + 10
    while slow_server.metric("tserve_dropped_total", model=MODEL, reason="disconnected") == dropped_before:
        assert time.monotonic() < deadline, "nothing of the request was dropped"
        time.sleep(0.1)
    time.sleep(DELAY_S * 2)  # the batches running when it left end
    ran = slow_server.metric("tserve_batch_size_sum", model=MODEL) - ran_before
    dropped = slow_server.metric("tserve_dropped_total", model=MODEL, reason="disconnected") - dropped_before
    time.sleep(DELAY_S * 2)
    assert slow_server.metric("tserve_batch_size_sum", model=MODEL) - ran_before == ran, "a batch ran after"
    # 64 texts of 4 pieces each; a batch running when the client left may count its pieces twice
    assert ran < 256 and dropped >= 256 - ran


def test_over_the_decode_cost_cap_is_422_before_queueing(tmp_path: Path) -> None:
    env = {"TSERVE_MAX_DECODE_COST_PER_REQUEST": "10000"}
    with server_process(small_server_command(), env, tmp_path / "server.log") as server:
        r = httpx.post(f"{server.url}/v1/translate", json=WORST, timeout=30)
        assert r.status_code == 422
        assert r.json()["error"]["limit"] == 10000
        assert server.metric("tserve_batch_size_count", model=MODEL) == 0
