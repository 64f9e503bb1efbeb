"""The translation rows of the ``host`` stage: our engine's host side per sentence-step, with every
onnxruntime run made free (``free_runs.py``).

The real translator, tokenizer, running decode, search and decoder of each layout run; the encoder,
the decoder and the device backend's ``Gather`` sessions answer at once. The decoder's candidates
are the same every step except that from step ``STEPS - 1`` on each row's best is </s>, far ahead,
so every sentence of a beam-4 search ends after exactly ``STEPS`` steps, whatever joins it. Two layouts:
the CPU's (``per_layer_kv_slots``, int8) and the device's (``per_layer_kv_positions``, fp16, with
IO binding, the path a CUDA session takes, here on CPU OrtValues).

A sentence-step is one sentence in one decoder step; its cost here is the whole ``translate`` call
(tokenizing, the search, the cache's moves, detokenizing) over the sentence-steps it made, which is
what the host adds to a GPU's step of that batch: in µs of the process's CPU (on a shared machine
a wall clock also counts the others' work; the wall figure is a column). Small batches are
translated several times over (``SENTENCES``), one call after another, so that one sentence's
figure is not one call's 20 steps. Continuous: sentences join a running decode
between steps, so that ``batch`` decode at once, as the continuous executor runs them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.harness import Bench
from benchmarks.host.free_runs import Choose, Feeds, FreeRuns, Outputs, Unwritten, shape_of
from benchmarks.host.replay import recorded
from benchmarks.results import Figure, Results, Row
from service.artefacts import (
    CROSS_ATTENTION,
    INPUT_IDS,
    LOG_PROBS,
    MEMORY_KEYS,
    POSITIONS,
    SOURCE_MASK,
    TOP_K,
    TOP_LOG_PROBS,
    TOP_TOKENS,
    past_of,
    read_manifest,
)
from service.engine.base import TranslateItem, TranslateOptions
from service.engine.session import ELEMENT_NUMPY
from service.engine.translation.translator import OnnxTranslator

STEPS = 20  # decoder steps every sentence takes
SENTENCES = 64  # a whole-batch pass translates at least this many, in calls of its batch
FIRST_TOKEN = 10  # the candidates' ids start here: clear of the special tokens
LAYOUTS = ("cpu", "device")  # the slots layout on the host backend; positions with IO binding


def _dtypes(session: ort.InferenceSession) -> dict[str, type[np.generic]]:
    return {o.name: ELEMENT_NUMPY[o.type] for o in session.get_outputs()}


def encoder_outputs(session: ort.InferenceSession, n_layers: int, n_heads: int, d_head: int) -> Outputs:
    """The encoder's memory K/V, (n_layers, B, heads, S, d_head), for the run's input ids."""
    dtypes = _dtypes(session)

    def outputs(names: list[str], feeds: Feeds) -> dict[str, np.ndarray | Unwritten]:
        batch, width = shape_of(feeds[INPUT_IDS])
        shape = (n_layers, batch, n_heads, width, d_head)
        return {name: Unwritten(shape, dtypes[name]) for name in names}

    return outputs


def decoder_outputs(session: ort.InferenceSession, eos_id: int, steps: int = STEPS) -> Outputs:
    """Each row's candidates (``FIRST_TOKEN`` …; from step ``steps - 1`` on </s> first, far ahead
    of the others, so that every beam of the sentence ends there), its attention and full
    log-probs where asked, and a growing cache's next ``present_*`` (a cache written in place, the
    slots', is the graph's business and left alone)."""
    dtypes = _dtypes(session)
    made_for: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (rows, top_k) → candidates

    def candidates(n: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        if (n, top_k) not in made_for:
            tokens = np.broadcast_to(FIRST_TOKEN + np.arange(top_k), (n, top_k))
            scores = np.broadcast_to(-0.25 * (1.0 + np.arange(top_k)), (n, top_k))
            made_for[n, top_k] = tokens.astype(dtypes[TOP_TOKENS]), scores.astype(dtypes[TOP_LOG_PROBS])
        return made_for[n, top_k]

    def outputs(names: list[str], feeds: Feeds) -> dict[str, np.ndarray | Unwritten]:
        step = np.asarray(feeds[POSITIONS])
        n, top_k = len(step), int(np.asarray(feeds[TOP_K])[0])
        made: dict[str, np.ndarray | Unwritten] = {}
        if top_k:
            tokens, scores = candidates(n, top_k)
            ending = step >= steps - 1
            if ending.any():
                tokens, scores = tokens.copy(), scores.copy()
                tokens[ending, 0] = eos_id
                scores[ending] -= 10
                scores[ending, 0] = 0
            made[TOP_TOKENS], made[TOP_LOG_PROBS] = tokens, scores
        if LOG_PROBS in names:
            made[LOG_PROBS] = np.full((n, session.get_outputs()[0].shape[1] or 1), -20.0, dtypes[LOG_PROBS])
        if CROSS_ATTENTION in names:
            made[CROSS_ATTENTION] = np.zeros((n, shape_of(feeds[SOURCE_MASK])[1]), dtypes[CROSS_ATTENTION])
        for name in names:
            past = feeds.get(past_of(name)) if name.startswith("present") else None
            if past is not None:
                _, heads, length, d_head = shape_of(past)
                made[name] = Unwritten((n, heads, length + 1, d_head), dtypes[name], reuse=past_of(name))
        return {name: made[name] for name in names if name in made}

    return outputs


def translation_outputs(directory: Path) -> Choose:
    """Each of the artefact's sessions' kind and free outputs, told by its graph's names: the
    decoder's (it ranks candidates), the encoder's (the memory); any other graph's outputs are
    recorded once and replayed (``replay.recorded``), counted as "other"."""
    manifest = read_manifest(directory)
    info, eos_id = manifest.translation, manifest.special_ids.eos
    if info is None or eos_id is None:
        raise ValueError(f"{directory}: not a translation artefact")

    def choose(session: ort.InferenceSession, model: str | bytes) -> tuple[str, Outputs]:
        outputs = {o.name for o in session.get_outputs()}
        if TOP_TOKENS in outputs:
            return "decoder", decoder_outputs(session, eos_id)
        if MEMORY_KEYS in outputs:
            return "encoder", encoder_outputs(session, info.n_layers, info.n_heads, info.d_head)
        return "other", recorded(session)

    return choose


@contextmanager
def free_translator(directory: Path, layout: str, runs: FreeRuns) -> Iterator[OnnxTranslator]:
    """The artefact's translator, every session it makes in the block free and counted in
    ``runs`` (under "encoder", "decoder" and "other")."""
    with runs.made_free(translation_outputs(directory)):
        yield OnnxTranslator(directory, io_binding=layout == "device")


@dataclass(frozen=True)
class HostCost:
    us_per_sentence_step: float  # the process's CPU
    wall_us_per_sentence_step: float
    runs_per_step: float  # onnxruntime runs per decoder step: the decoder's and the cache's moves
    sentence_steps: int


def sources(n: int) -> list[str]:
    """``n`` different short sentences (their length does not matter to free runs)."""
    return [f"a dog runs {i}" for i in range(n)]


@contextmanager
def counted(runs: FreeRuns) -> Iterator[dict[str, float]]:
    """The process's CPU time, the wall time and the runs made inside the block."""
    before = runs.runs.copy()
    out: dict[str, float] = {}
    start, cpu = time.perf_counter(), time.process_time()
    yield out
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - start, time.process_time() - cpu
    made = runs.runs - before
    out["decoder"] = made["decoder"]
    out["runs"] = made.total() - made["encoder"]  # the decoder's and whatever moves its cache


def whole_batch(engine: OnnxTranslator, runs: FreeRuns, batch: int, beam: int, calls: int = 1) -> HostCost:
    """``calls`` ``translate`` calls of ``batch`` sentences each, one after another."""
    items = [TranslateItem(t, TranslateOptions(beam_size=beam)) for t in sources(batch)]
    with counted(runs) as took:
        results = [r for _ in range(calls) for r in engine.translate(items)]
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"free-run translation failed: {failed[0]!r}")
    return _cost(took, calls * batch * STEPS)


def continuous(engine: OnnxTranslator, runs: FreeRuns, batch: int, beam: int, waves: int = 3) -> HostCost:
    """``waves`` × ``batch`` sentences through one running decode, joining a share a step so
    that ``batch`` decode at once, as the continuous executor admits them."""
    total = waves * batch
    encoded = engine.encode(sources(total))
    options = TranslateOptions(beam_size=beam)
    per_step = math.ceil(batch / STEPS)
    decode = engine.new_decode()
    waiting = list(range(total))
    done = 0
    with counted(runs) as took:
        while done < total:
            room = batch - len(decode.sentences)
            joining = waiting[: min(per_step, room)] if decode.can_admit() else []
            del waiting[: len(joining)]
            if joining:
                decode.admit([(i, encoded[i], options) for i in joining])
            done += len(decode.step())
    return _cost(took, total * STEPS)


def _cost(took: dict[str, float], sentence_steps: int) -> HostCost:
    return HostCost(
        us_per_sentence_step=took["cpu_seconds"] / sentence_steps * 1e6,
        wall_us_per_sentence_step=took["seconds"] / sentence_steps * 1e6,
        runs_per_step=took["runs"] / max(took["decoder"], 1),
        sentence_steps=sentence_steps,
    )


def measure(
    engine: OnnxTranslator, runs: FreeRuns, batches: Sequence[int], beam: int = 4, rounds: int = 2
) -> dict[str, HostCost]:
    """The best of ``rounds`` per batch size and mode: keys "whole/<batch>", "continuous/<batch>"
    (continuous where the layout lets sentences join midway)."""
    whole_batch(engine, runs, 2, beam)  # first allocations
    costs: dict[str, HostCost] = {}
    for batch in batches:
        modes = ["whole", "continuous"] if engine.joins_midway and batch > 1 else ["whole"]
        for mode in modes:
            passes = (_measured(engine, runs, mode, batch, beam) for _ in range(rounds))
            costs[f"{mode}/{batch}"] = min(passes, key=lambda c: c.us_per_sentence_step)
    return costs


def _measured(engine: OnnxTranslator, runs: FreeRuns, mode: str, batch: int, beam: int) -> HostCost:
    if mode == "continuous":
        return continuous(engine, runs, batch, beam)
    return whole_batch(engine, runs, batch, beam, calls=max(1, SENTENCES // batch))


BATCHES = (1, 32, 128, 512)
FIGURES = {
    ("cpu", "whole/128"): Figure.HOST_CPU_BATCH128,
    ("device", "whole/128"): Figure.HOST_DEVICE_BATCH128,
}
ONE = {"cpu": Figure.HOST_CPU_ONE, "device": Figure.HOST_DEVICE_ONE}


def run(bench: Bench) -> None:
    """Our checkpoint's int8 (the CPU layout) and fp16 (the device layout, exported here)."""
    from export.translation import export_translation

    int8 = bench.models.get("small/int8")
    if int8 is None:
        bench.results.note("host translation rows not measured: no int8 artefact of our checkpoint")
        return
    (fp16,) = export_translation(bench.args.checkpoint, bench.artefacts, ["fp16"])
    for layout, directory in (("cpu", int8), ("device", fp16)):
        print(f"== host: translation, {layout} layout, free onnxruntime runs", flush=True)
        runs = FreeRuns()
        with free_translator(directory, layout, runs) as engine:
            report(bench.results, layout, measure(engine, runs, BATCHES, rounds=bench.rounds))


def report(results: Results, layout: str, costs: dict[str, HostCost]) -> None:
    """One section per layout, its rows CPU µs a sentence-step (baseline: a whole batch of 128)."""
    section = f"host side, free onnxruntime runs, translate beam 4, {layout} layout: CPU µs a sentence-step"
    for key, cost in costs.items():
        extra = {
            "runs_per_step": round(cost.runs_per_step, 2),
            "wall_us": round(cost.wall_us_per_sentence_step, 1),
        }
        row = Row(
            section,
            key,
            cost.us_per_sentence_step,
            "µs",
            key == "whole/128",
            False,
            extra,
            figure=FIGURES.get((layout, key)),
        )
        results.add(row)
    one = costs["whole/1"]
    results.add(
        Row(
            f"host side, free onnxruntime runs, translate beam 4, {layout} layout: one sentence",
            "ms a step",
            one.us_per_sentence_step / 1000,
            "ms",
            True,
            False,
            figure=ONE[layout],
        )
    )
    if layout == "device":
        results.add(
            Row(
                "host side, device layout: onnxruntime runs per decoder step",
                "runs",
                one.runs_per_step,
                "runs",
                True,
                False,
                figure=Figure.HOST_DEVICE_RUNS,
            )
        )
