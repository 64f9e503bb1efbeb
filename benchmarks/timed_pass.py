"""One timed pass of a translation system over sentences: the measurement that the translation
stages (benchmarks/translation.py) and the kernel bound (benchmarks/kernels.py) both take.

Batches are formed once from length-sorted sentences (``batches``), so every system decodes the
same batches in the same order; a natural run caps each batch at ``natural_max_len``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.common import CpuMeter
from benchmarks.translators import TextCodec, Translator, Workload


@dataclass(frozen=True)
class Run:
    tokens_per_s: float
    outputs: list[str]  # in input order
    seconds: float
    cores_used: float  # this process's CPU time / wall time
    server_cpu_ms_per_request: float | None  # over HTTP: the server's CPU per request


def batches(texts: Sequence[str], codec: TextCodec, size: int) -> list[list[int]]:
    """Index batches of ``size`` over length-sorted sentences (the same for every system)."""
    lengths = [len(x) for x in codec.encode(texts)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


def natural_max_len(texts: Sequence[str], codec: TextCodec) -> int:
    return min(256, 2 * max(len(x) for x in codec.encode(texts)) + 10)


def throughput(
    system: Translator, texts: Sequence[str], w: Workload, codec: TextCodec, warm_up: bool = True
) -> Run:
    """One pass over ``texts`` in batches of ``w.batch``, each batch one call (one request over HTTP).

    Cores used = process CPU time / wall time: below the thread count when the system was
    starved by other load on the machine (or, for HTTP, the client's share only).
    """
    outputs = [""] * len(texts)
    tokens, seconds, cpu, calls = 0, 0.0, 0.0, 0
    if warm_up:
        warm = Workload(w.beam, 1, min(w.max_len, 8) if w.forced else 8, w.forced)
        system.translate(texts[: min(2, len(texts))], warm)
    server = CpuMeter(system.server_pids) if system.server_pids else None
    server_cpu_at_start = server.cpu_seconds() if server else 0.0
    for idx in batches(texts, codec, w.batch):
        chunk = [texts[i] for i in idx]
        wl = w if w.forced else Workload(w.beam, w.batch, natural_max_len(chunk, codec), False)
        t0, c0 = time.perf_counter(), time.process_time()
        out, n = system.translate(chunk, wl)
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
        tokens += n
        calls += 1
        for i, o in zip(idx, out, strict=True):
            outputs[i] = o
    server_ms = 1000 * (server.cpu_seconds() - server_cpu_at_start) / calls if server else None
    return Run(tokens / seconds, outputs, seconds, cpu / seconds, server_ms)
