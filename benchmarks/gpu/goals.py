"""The GPU issue's speed goals, checked against the speed stage's figures: reported, never
required (a missed goal is a finding for the next run, not a failed check)."""

from __future__ import annotations

from benchmarks.gpu.ours import BEAM
from benchmarks.gpu.run import GpuRun
from benchmarks.results import Row

TOKENS_PER_S_GOAL = 40_000  # beam 4, the largest batch
HTTP_SHARE_GOAL = 0.8  # translation over HTTP against in-process, the largest batch
SHORT_P50_GOAL_MS = 5.0  # one short sentence, beam 4, in-process
SENTENCES_PER_S_GOAL = 20_000  # embeddings over HTTP, 4 clients × a batch each
DYNAMIC_VS_SERIAL_GOAL = 10.0


def translation_goals(
    gpu: GpuRun,
    best: dict[tuple[str, int], float],
    in_process: tuple[str, str],
    http: str | None,
    short_p50_ms: float | None,
) -> None:
    """``best``: tokens/s by (system, batch); ``in_process``: the names of the whole-batch and the
    continuous rows, the faster of which is ours; ``http``: the HTTP row's name, if it ran."""
    batch = max(gpu.sizes.batches)
    ours = max(best[name, batch] for name in in_process)
    gpu.verdict(
        f"translation, beam {BEAM}, batch {batch}: ≥ {TOKENS_PER_S_GOAL:,} target tokens/s",
        ours >= TOKENS_PER_S_GOAL,
        f"{ours:,.0f} tokens/s in-process (the faster of whole batches and continuous)",
        required=False,
    )
    over_http = best.get((http, batch)) if http is not None else None
    share = over_http / ours if over_http and ours else None
    gpu.verdict(
        f"translation, batch {batch}: over HTTP ≥ {HTTP_SHARE_GOAL:g}× in-process",
        None if share is None else share >= HTTP_SHARE_GOAL,
        "not measured" if share is None else f"{share:.2f}× ({over_http:,.0f} against {ours:,.0f} tokens/s)",
        required=False,
    )
    gpu.verdict(
        f"one short translation, beam {BEAM}: p50 ≤ {SHORT_P50_GOAL_MS:g} ms",
        None if short_p50_ms is None else short_p50_ms <= SHORT_P50_GOAL_MS,
        "not measured" if short_p50_ms is None else f"{short_p50_ms:.1f} ms in-process",
        required=False,
    )


def embedding_goal(gpu: GpuRun, batch: int, over_http: Row | None, in_process: float) -> None:
    """Sentences/s over HTTP (4 clients × ``batch``), the in-process rate beside it."""
    goal = f"embeddings over HTTP, 4 clients × {batch}: ≥ {SENTENCES_PER_S_GOAL:,} sentences/s"
    if over_http is None:
        gpu.verdict(goal, None, f"not measured ({in_process:,.0f} sentences/s in-process)", False)
        return
    detail = f"{over_http.value:,.0f} sentences/s ({in_process:,.0f} in-process)"
    gpu.verdict(goal, over_http.value >= SENTENCES_PER_S_GOAL, detail, required=False)


def batching_goal(gpu: GpuRun, task: str, dynamic: Row | None, one: Row | None) -> None:
    """Dynamic batching's gain over batch size 1."""
    goal = f"{task}: dynamic batching ≥ {DYNAMIC_VS_SERIAL_GOAL:g}× batch size 1"
    if dynamic is None or one is None or not one.value:
        gpu.verdict(goal, None, "not measured", False)
        return
    times = dynamic.value / one.value
    detail = f"{times:.1f}× ({dynamic.value:,.0f} against {one.value:,.0f} sentences/s)"
    gpu.verdict(goal, times >= DYNAMIC_VS_SERIAL_GOAL, detail, required=False)
