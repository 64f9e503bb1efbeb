"""Memory the service holds: its threads share a few glibc heaps (``limit_heaps``), large buffers
get mappings of their own (``map_large_blocks``), freed memory goes back to the operating system
once the service is quiet, and Python's garbage collector is tuned for serving (``FrozenHeap``).

A busy period frees its memory when it ends — a decode's buffers, onnxruntime's step outputs,
request and response objects — but glibc keeps freed pages in its heaps and returns to the OS
only what lies at the top of one, so the resident size stays at the period's peak. glibc's
``malloc_trim(0)`` releases every free page of every heap, once the service is idle, where it
costs no request anything; mapping every buffer of its own instead would return memory at once
but fault every fresh buffer's pages in (docs/decisions.md, "Memory", gives the figures).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)


class Quiet(Protocol):
    """What the trimmer reads of a queue."""

    @property
    def submitted(self) -> int: ...  # requests ever submitted

    @property
    def idle(self) -> bool: ...  # nothing queued or running


def _load_libc() -> ctypes.CDLL | None:
    try:  # find_library runs ldconfig: once, at import
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _load_libc()


def _glibc(name: str) -> Callable[..., int] | None:
    """A glibc function; None on other C libraries (musl, macOS), which have neither heaps per
    thread to limit nor free pages to trim in this way."""
    function: Callable[..., int] | None = getattr(_LIBC, name, None)
    return function


_MALLOC_TRIM, _MALLOPT = _glibc("malloc_trim"), _glibc("mallopt")
_M_ARENA_MAX, _M_MMAP_THRESHOLD = -8, -3  # malloc.h
MAX_MMAP_THRESHOLD_KB = 32 * 1024  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)


def limit_heaps(heaps: int) -> bool:
    """Let the process's threads share at most ``heaps`` glibc heaps (``mallopt(M_ARENA_MAX)``,
    what ``MALLOC_ARENA_MAX`` sets); whether it was applied. 0 leaves glibc's default.

    glibc gives each new thread a heap of its own, up to 8 per core, and each keeps the free
    memory of its own peak. The service's threads (event loop, each model's worker threads,
    the embedder's, onnxruntime's and the tokenizer's) then hold the sum of their peaks:
    the three default models peaked at 641–649 MB resident while translating test2016 with both
    translators and embedding the STS sentences, 514–545 MB with 2 heaps, as fast. Call it
    before the threads start: one that has a heap keeps it.
    """
    return heaps > 0 and _MALLOPT is not None and bool(_MALLOPT(_M_ARENA_MAX, heaps))


def map_large_blocks(threshold_kb: int) -> bool:
    """Give every block of at least ``threshold_kb`` KiB a mapping of its own, unmapped when it is
    freed (``mallopt(M_MMAP_THRESHOLD)``, what ``MALLOC_MMAP_THRESHOLD_`` sets); whether it was
    applied. 0 leaves glibc's default.

    By default the threshold starts at 128 KiB and rises to the size of each mapped block freed,
    up to 32 MiB, so that a decode's large buffers (its cache and memory slots, megabytes each,
    regrown as it runs) soon come from the heaps. There a freed buffer's pages stay resident
    until an idle trim, and a fresh one that reuses them is zeroed page by page; a mapping is
    returned when freed, and its untouched pages cost nothing. A threshold of a few MiB lowers
    the peak without slowing beam search, whose many smaller buffers would fault their pages in
    afresh under a threshold below 1 MiB (docs/decisions.md, "Blocks of 2 MiB and more get
    mappings of their own"). Call it before the threads start.
    """
    return (
        threshold_kb > 0 and _MALLOPT is not None and bool(_MALLOPT(_M_MMAP_THRESHOLD, threshold_kb * 1024))
    )


def release_free_memory() -> bool:
    """Give the heaps' free pages back to the OS; whether any were released."""
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False


async def trim_when_idle(
    queues: Callable[[], Sequence[Quiet]], interval_s: float, let_go: Callable[[], object] = lambda: None
) -> None:
    """Every ``interval_s``: if requests came since the last trim (or none was made yet) and
    every queue is idle now, ``let_go`` of what is kept for the next request (the engines'
    spare buffers) and release the free memory (on a thread: it walks the heaps, and holds each
    heap's lock only while it does). A steady load is never interrupted; the resident size
    falls back within ``interval_s`` of the load's end."""
    trimmed_at: int | None = None
    while True:
        await asyncio.sleep(interval_s)
        current = queues()
        submitted = sum(b.submitted for b in current)
        if submitted != trimmed_at and all(b.idle for b in current):
            trimmed_at = submitted
            let_go()
            released = await asyncio.to_thread(release_free_memory)
            log.debug("idle: free memory %s", "released" if released else "had nothing to release")


class FrozenHeap:
    """Python's cyclic garbage collector tuned for serving: what is alive once the models are
    loaded is frozen (never walked again, as vLLM and SGLang do after their warm-up), and the
    youngest generation is collected after ``young_threshold`` net new objects instead of 700.

    Under load the objects of every request in flight (frames, futures, dicts) are young, so at
    the default threshold a collection starts every few requests and walks all of them
    (docs/decisions.md, "The garbage collector skips the loaded heap"). Garbage cycles are still
    collected, less often; ``thaw`` (at shutdown) makes the frozen objects collectable again and
    restores the thresholds.
    """

    def __init__(self, young_threshold: int) -> None:
        self.young_threshold = young_threshold
        self._previous: tuple[int, int, int] | None = None

    def freeze(self) -> None:
        if self._previous is not None:
            return
        # The young generations only: a full collection walks the whole heap (0.34 s with the
        # export's imports loaded), and old garbage frozen here becomes collectable at ``thaw``.
        gc.collect(1)
        gc.freeze()
        self._previous = gc.get_threshold()
        gc.set_threshold(self.young_threshold, *self._previous[1:])

    def thaw(self) -> None:
        if self._previous is None:
            return
        gc.set_threshold(*self._previous)
        gc.unfreeze()
        self._previous = None
