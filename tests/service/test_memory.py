"""Freed memory back to the OS once the service is idle (service/memory.py)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from service import memory
from tests.service.api.conftest import serving, small_settings

pytestmark = pytest.mark.anyio


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(memory._MALLOC_TRIM is None, reason="not glibc: nothing to trim")
def test_freed_heap_pages_go_back_to_the_os() -> None:
    blocks = [bytearray(64 * 1024) for _ in range(1600)]  # 100 MiB on the heap, below mmap's threshold
    for block in blocks:
        block[::4096] = b"\1" * len(block[::4096])  # touched: resident
    pin = bytearray(64 * 1024)  # above them: glibc's own trim at free() cannot reach them
    del blocks
    kept = _resident_mib()
    assert memory.release_free_memory()
    assert _resident_mib() < kept - 80, (kept, _resident_mib())
    del pin


_HEAPS_SCRIPT = """
import sys, threading
from service import memory
limited = memory.limit_heaps(int(sys.argv[1]))
hold, go = threading.Barrier(9), threading.Event()
def run():
    block = bytearray(1000)  # a thread's first allocation takes it a heap
    hold.wait()
    go.wait()
threads = [threading.Thread(target=run) for _ in range(8)]
for t in threads:
    t.start()
hold.wait()
memory._glibc("malloc_stats")()  # one "Arena N:" block a heap, on stderr
go.set()
print(limited)
"""


@pytest.mark.skipif(memory._MALLOPT is None, reason="not glibc: no heaps per thread")
def test_the_threads_share_the_heaps_they_are_limited_to() -> None:
    """Eight threads allocating at once get a heap each from glibc (up to 8 per core), or share
    the 2 they are limited to."""

    def heaps(limit: int) -> tuple[int, str]:
        run = subprocess.run(
            [sys.executable, "-c", _HEAPS_SCRIPT, str(limit)], capture_output=True, text=True, check=True
        )
        return run.stderr.count("Arena "), run.stdout.strip()

    default, applied = heaps(0)
    assert default >= 8 and applied == "False"  # 0: glibc's default, nothing set
    assert heaps(2) == (2, "True")


_MAPPED_SCRIPT = """
import ctypes, sys
from service import memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]

libc = memory._LIBC
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
applied = memory.map_large_blocks(int(sys.argv[1]))
libc.free(libc.malloc(8 << 20))  # mapped (above 128 KiB); freed, it raises glibc's own threshold
before = libc.mallinfo2().hblkhd
block = libc.malloc(3 << 20)
print(applied, libc.mallinfo2().hblkhd - before >= 3 << 20)
libc.free(block)
"""


@pytest.mark.skipif(getattr(memory._LIBC, "mallinfo2", None) is None, reason="not glibc ≥ 2.33")
def test_large_blocks_keep_mappings_of_their_own() -> None:
    """By default a freed 8 MiB block raises glibc's threshold, so a 3 MiB one then comes from a
    heap; with the threshold fixed at 2 MiB it is mapped afresh."""

    def mapped(threshold_kb: int) -> str:
        run = subprocess.run(
            [sys.executable, "-c", _MAPPED_SCRIPT, str(threshold_kb)],
            capture_output=True,
            text=True,
            check=True,
        )
        return run.stdout.strip()

    assert mapped(0) == "False False"
    assert mapped(2048) == "True True"


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The trims made from now on (none really made)."""
    trims: list[bool] = []

    def release() -> bool:
        trims.append(True)
        return True

    monkeypatch.setattr(memory, "release_free_memory", release)
    return trims


@dataclass
class FakeQueue:
    submitted: int = 0
    idle: bool = True


async def test_trims_once_after_requests_when_every_queue_is_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    main, other = FakeQueue(), FakeQueue()

    def release() -> bool:
        trims.append(main.submitted)
        return True

    monkeypatch.setattr(memory, "release_free_memory", release)
    task = asyncio.create_task(memory.trim_when_idle(lambda: [main, other], 0.01))

    async def settle() -> None:
        await asyncio.sleep(0.06)

    try:
        await settle()
        assert trims == [0]  # once after start-up (loading leaves garbage too), not again
        main.submitted, main.idle = 1, False
        await settle()
        assert trims == [0]  # never while a queue works
        main.idle, other.idle = True, False
        await settle()
        assert trims == [0]  # nor while another does
        other.idle = True
        await settle()
        assert trims == [0, 1]  # the load is over: once
        main.submitted = 2  # a request came and went between two looks
        await settle()
        assert trims == [0, 1, 2]
    finally:
        task.cancel()


def _ordered(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Callable[[], int]]:
    """The events in order, from now on: each trim (none really made), and a ``let_go``."""
    order: list[str] = []

    def trim() -> bool:
        order.append("trim")
        return True

    def let_go() -> int:
        order.append("let go")
        return 0

    monkeypatch.setattr(memory, "release_free_memory", trim)
    return order, let_go


async def test_an_idle_trim_lets_go_of_what_is_kept_first(monkeypatch: pytest.MonkeyPatch) -> None:
    order, let_go = _ordered(monkeypatch)
    queue = FakeQueue()
    task = asyncio.create_task(memory.trim_when_idle(lambda: [queue], 0.01, let_go))
    try:
        await asyncio.sleep(0.06)
        assert order == ["let go", "trim"]
        queue.submitted, queue.idle = 1, False
        await asyncio.sleep(0.06)
        assert order == ["let go", "trim"]  # nothing let go while a queue works
    finally:
        task.cancel()


async def test_the_service_lets_its_engines_spare_memory_go_before_it_trims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order, let_go = _ordered(monkeypatch)
    async with serving(small_settings(memory_trim_interval_s=0.01)) as served:
        # the fake translator keeps spare memory too (``KeepsSpareMemory``), as OnnxTranslator does
        served.translator.release_spare_memory = let_go  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)  # the trim after start-up
        order.clear()
        response = await served.client.post("/v1/translate", json={"text": "a b c"})
        assert response.status_code == 200
        await asyncio.sleep(0.05)
        assert order == ["let go", "trim"]


async def test_the_service_trims_after_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    trims = _counted(monkeypatch)
    async with serving(small_settings(memory_trim_interval_s=0.01)) as served:
        await asyncio.sleep(0.05)
        before = len(trims)
        assert before >= 1
        response = await served.client.post("/v1/translate", json={"text": "a b c"})
        assert response.status_code == 200
        await asyncio.sleep(0.05)
        assert len(trims) == before + 1


async def test_zero_turns_trimming_off(monkeypatch: pytest.MonkeyPatch) -> None:
    trims = _counted(monkeypatch)
    async with serving(small_settings(memory_trim_interval_s=0)) as served:
        assert (await served.client.post("/v1/translate", json={"text": "a b c"})).status_code == 200
        await asyncio.sleep(0.05)
    assert trims == []


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


async def test_the_heap_is_frozen_while_serving_and_thawed_after() -> None:
    before = gc.get_threshold()
    async with serving(small_settings(gc_young_threshold=5000)) as s:
        assert s.app.state.runtime.state == "ready"
        assert gc.get_threshold() == (5000, *before[1:])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_after_freezing_are_collected_and_frozen_ones_after_thawing() -> None:
    heap = memory.FrozenHeap(young_threshold=5000)
    frozen = _Node()
    frozen_ref = weakref.ref(frozen)
    heap.freeze()
    try:
        new = weakref.ref(_Node())
        del frozen
        gc.collect()
        assert new() is None
        assert frozen_ref() is not None  # frozen: left alone by the collector
    finally:
        heap.thaw()
    gc.collect()
    assert frozen_ref() is None
