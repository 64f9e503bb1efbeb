"""``python -m service`` with ``TSERVE_WORKERS=2`` on the tiny artefacts, over HTTP: two serving
processes on one port whose ``/metrics`` adds both up (each process's own count read from its
metric file), gauges by their multiprocess mode, glossaries and the translation cache the same
whichever process answers, a killed process replaced (the host not ready meanwhile), and a
SIGTERM that drains both with nothing lost."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.reliability.load import Outcome, Request, run_load, statuses
from tests.servers import ServerProcess, artefact_env, server_process, service_command


def _workers_env(artefact_root: Path, metrics_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **artefact_env(artefact_root),
        "TSERVE_WORKERS": "2",
        "TSERVE_METRICS_DIR": str(metrics_dir),
        "TSERVE_TRANSLATE_BATCHING": "batch",  # keeps each process's threads few on a small machine
        **extra,
    }


@pytest.fixture(scope="module")
def artefact_root(
    translation_artefact: Path, embedding_artefact: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("served-artefacts")
    for artefact in (translation_artefact, embedding_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def server(
    artefact_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    base = tmp_path_factory.mktemp("workers")
    env = _workers_env(artefact_root, base / "metrics", TSERVE_GLOSSARY_DIR=str(base / "glossaries"))
    with server_process(service_command(), env, base / "server.log") as s:
        yield s, base / "metrics"


def _serving_pids(server: ServerProcess) -> set[int]:
    """The parent's spawned serving processes (not multiprocessing's resource tracker), alive: a
    killed one the parent has not reaped yet is a zombie, with no command line to read."""
    pids = set()
    for child in psutil.Process(server.proc.pid).children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                pids.add(child.pid)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return pids


def _per_process(metrics_dir: Path, sample: str, **labels: str) -> dict[int, float]:
    """Each process's own value of a counter sample, from its file in the metrics directory."""
    values: dict[int, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.removeprefix("counter_"))
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            _, name, key_labels, _ = json.loads(key)
            if name == sample and key_labels == labels:
                values[pid] = values.get(pid, 0.0) + value
    return values


def _spread(send: Callable[[int], httpx.Response], count: int) -> list[httpx.Response]:
    """``count`` requests, eight at a time, each on a connection of its own (so the kernel deals
    them out among the processes)."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(send, range(count)))


def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def test_metrics_add_up_both_processes(server: tuple[ServerProcess, Path]) -> None:
    s, metrics_dir = server
    pids = _serving_pids(s)
    assert len(pids) == 2
    sample, labels = "tserve_requests_total", {"endpoint": "/v1/embed", "status": "200"}
    before = _per_process(metrics_dir, sample, **labels)
    sent = 48
    answers = _spread(
        lambda i: httpx.post(f"{s.url}/v1/embed", json={"texts": [f"text {i}"]}, timeout=30), sent
    )
    assert {r.status_code for r in answers} == {200}
    after = _per_process(metrics_dir, sample, **labels)
    served = {pid: after.get(pid, 0.0) - before.get(pid, 0.0) for pid in pids}
    print(f"requests per process: {sorted(served.values())}")
    assert all(n > 0 for n in served.values()), served  # both served some
    assert sum(served.values()) == sent
    assert s.metric(sample, **labels) == sum(after.values())  # /metrics: every process's, added up
    assert s.metric("tserve_ready") == 1  # livemin, not the sum
    info = {
        dict(labels)["model"]: v for (name, labels), v in s.scrape().items() if name == "tserve_model_info"
    }
    assert info == {"tiny-en-de": 1, "tiny-bert": 1}, info  # livemax, not the sum
    assert s.metric("tserve_inflight_requests") == 1  # livesum: this scrape only


def test_the_translation_cache_answers_the_same_from_every_process(
    server: tuple[ServerProcess, Path],
) -> None:
    s, _ = server

    def lookups() -> tuple[float, float]:
        return tuple(  # type: ignore[return-value]
            s.metric(f"tserve_translation_cache_{kind}_total", model="tiny-en-de")
            for kind in ("hits", "misses")
        )

    hits, misses = lookups()
    body = {"text": "the same sentence again", "target_language": "de"}
    first = httpx.post(f"{s.url}/v1/translate", json=body, timeout=30).json()["translations"]
    answers = _spread(lambda _: httpx.post(f"{s.url}/v1/translate", json=body, timeout=30), 32)
    assert all(a.json()["translations"] == first for a in answers)
    # Each process keeps its own cache and misses the sentence until it has translated it once
    # (racing requests each miss): at most the eight in flight, per process, miss.
    hits_after, misses_after = lookups()
    assert hits_after - hits + misses_after - misses == 33
    assert misses_after - misses <= 16 and hits_after - hits >= 17


def test_a_glossary_made_through_one_process_is_used_and_deleted_in_every_one(
    server: tuple[ServerProcess, Path],
) -> None:
    s, _ = server
    made = httpx.post(
        f"{s.url}/v1/glossaries",
        json={
            "name": "g",
            "source_language": "en",
            "target_language": "de",
            "entries": [{"source": "cat", "target": "dogs"}],  # words the tiny vocabulary spells
        },
        timeout=30,
    )
    assert made.status_code == 201, made.text
    glossary = made.json()["id"]
    body = {"text": "a small cat sits", "target_language": "de", "glossary": glossary}
    used = _spread(lambda _: httpx.post(f"{s.url}/v1/translate", json=body, timeout=30), 16)
    assert all(
        r.status_code == 200 and "dogs" in r.json()["translations"][0]["hypotheses"][0]["text"] for r in used
    ), [r.text for r in used]
    assert httpx.delete(f"{s.url}/v1/glossaries/{glossary}", timeout=30).status_code == 204
    gone = _spread(lambda _: httpx.post(f"{s.url}/v1/translate", json=body, timeout=30), 16)
    assert {r.status_code for r in gone} == {404}, [r.text for r in gone]


def test_a_killed_process_is_replaced_and_the_host_is_not_ready_meanwhile(
    server: tuple[ServerProcess, Path],
) -> None:
    s, _ = server
    total = s.metric("tserve_requests_total", endpoint="/v1/embed", status="200")
    victim, survivor = sorted(_serving_pids(s))
    psutil.Process(victim).kill()
    seen: Counter[int] = Counter()

    def replaced() -> bool:
        seen[httpx.get(f"{s.url}/health/ready", timeout=5).status_code] += 1
        pids = _serving_pids(s)
        return seen[503] > 0 and len(pids) == 2 and victim not in pids and seen[200] > 0 and _all_ready(s)

    _eventually(replaced, "a replacement, ready")
    assert survivor in _serving_pids(s)
    # the killed process's counts stay in the sums
    assert s.metric("tserve_requests_total", endpoint="/v1/embed", status="200") == total
    assert httpx.post(f"{s.url}/v1/embed", json={"texts": ["after"]}, timeout=30).status_code == 200


def _all_ready(s: ServerProcess) -> bool:
    return all(httpx.get(f"{s.url}/health/ready", timeout=5).status_code == 200 for _ in range(4))


def _request(i: int) -> Request:
    return ("/v1/embed", {"texts": [f"load {i}"]}) if i % 2 else ("/v1/translate", {"text": f"load {i} " * 8})


def test_sigterm_drains_both_processes_with_nothing_lost(artefact_root: Path, tmp_path: Path) -> None:
    env = _workers_env(artefact_root, tmp_path / "metrics", TSERVE_DRAIN_DELAY_S="1", TSERVE_LOG_LEVEL="info")
    with server_process(service_command(), env, tmp_path / "server.log") as s:
        pids = _serving_pids(s)
        stop = threading.Event()
        outcomes: list[Outcome] = []

        def load() -> None:
            asyncio.run(run_load(s.url, _request, 10**6, 8, stop=stop.is_set, outcomes=outcomes))

        loader = threading.Thread(target=load)
        loader.start()
        _eventually(lambda: len(outcomes) >= 64, "the load")
        signalled = time.perf_counter()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # within the drain delay: new requests are refused by either process
        refused = httpx.post(f"{s.url}/v1/embed", json={"texts": ["late"]}, timeout=10)
        assert refused.status_code == 503
        stop.set()
        loader.join(60)
        assert not loader.is_alive()
        assert s.proc.wait(30) == 0
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)

    print(f"SIGTERM under load, two processes: {dict(statuses(outcomes))}")
    assert not [o for o in outcomes if o.status is None], "a request lost its connection"
    assert set(statuses(outcomes)) <= {200, 503}
    assert {o.status for o in outcomes if o.started < signalled - 0.2} == {200}
    served = _per_process(tmp_path / "metrics", "tserve_requests_total", endpoint="/v1/embed", status="200")
    # the metrics of both are read; which process took the 8 connections is the kernel's choice
    # (test_metrics_add_up_both_processes shows both serving)
    assert set(served) <= pids and sum(served.values()) > 0
