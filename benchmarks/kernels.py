"""Issue 12's bound: onnxruntime's runs of our graphs alone against CTranslate2's whole decode.

Both on one thread (our engine: one lane of one intra-op thread; CTranslate2 int8: one intra-op
thread), the same sentences at beam 4, in batches of 32 and one at a time. Our engine's encoder
and decoder sessions are wrapped (``TimedSession``) so that every run is timed: "onnxruntime's
runs alone" is the throughput ours would have with no Python around its graphs (search, cache
bookkeeping, tokenizing), a ratio to CTranslate2 that no work outside the graphs can pass.
Part of stage ``translation`` (``kernel_bound``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from benchmarks.results import Figure, Results, Row
from benchmarks.timed_pass import throughput
from benchmarks.translators import TextCodec, Translator, Workload

CT2_ONE_THREAD = "CTranslate2 int8, 1 thread"
OURS_ONE_THREAD = "ours int8, 1 thread"
OURS_GRAPHS_ALONE = "ours int8, 1 thread: onnxruntime's runs alone"


class TimedSession:
    """An onnxruntime session whose runs add up their wall time in ``seconds``; everything else
    is the session's own (``io_binding``, ``get_inputs``, ...)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.seconds = 0.0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._session.run, *args, **kwargs)

    def run_with_iobinding(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._session.run_with_iobinding, *args, **kwargs)

    def _timed(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def time_graphs(engine: Any) -> list[TimedSession]:
    """Wrap the encoder and decoder sessions of an ``OnnxTranslator`` (CPU backend) in place."""
    backend = engine.backend
    backend.encoder, backend.decoder = TimedSession(backend.encoder), TimedSession(backend.decoder)
    return [backend.encoder, backend.decoder]


def kernel_bound(
    results: Results,
    label: str,
    ct2: Translator,
    ours: Translator,
    graphs: Sequence[TimedSession],
    workloads: Sequence[tuple[Workload, Sequence[str], Figure, Figure, Figure]],
    codec: TextCodec,
    rounds: int,
) -> None:
    """A section per workload: CTranslate2 (the baseline), ours whole, ours' graph runs alone;
    each system's best of ``rounds`` passes; the workload's figures are those three rows'."""
    for w, texts, ct2_figure, ours_figure, graphs_figure in workloads:
        batch = f"batch {w.batch}" if w.batch > 1 else "one sentence at a time"
        section = (
            f"translate {label}: onnxruntime's runs alone against CTranslate2's whole decode, "
            f"1 thread, beam {w.beam}, {batch}, {len(texts)} sent."
        )
        for system in (ct2, ours):
            system.translate(texts[:2], Workload(w.beam, 1, 8, False))
        best: dict[str, tuple[float, float, float]] = {}  # name → (tok/s, seconds, graph seconds)
        for _ in range(rounds):
            for system in (ct2, ours):
                for g in graphs:
                    g.seconds = 0.0
                run = throughput(system, texts, w, codec, warm_up=False)
                in_graphs = sum(g.seconds for g in graphs) if system is ours else 0.0
                if run.tokens_per_s > best.get(system.name, (0.0, 0.0, 0.0))[0]:
                    best[system.name] = (run.tokens_per_s, run.seconds, in_graphs)
        ours_tps, ours_s, graph_s = best[ours.name]
        tokens = ours_tps * ours_s
        results.add(Row(section, ct2.name, best[ct2.name][0], "tok/s", baseline=True, figure=ct2_figure))
        ours_seconds = {"seconds": round(ours_s, 3)}
        results.add(Row(section, ours.name, ours_tps, "tok/s", extra=ours_seconds, figure=ours_figure))
        share = {"seconds": round(graph_s, 3), "share_of_ours": round(graph_s / ours_s, 2)}
        alone = Row(section, OURS_GRAPHS_ALONE, tokens / graph_s, "tok/s", extra=share, figure=graphs_figure)
        results.add(alone)
