"""Stage speed of the GPU check, embedding shapes: does our engine pay a cost per new input shape?

Our embedding engine reached 6,547 sentences/s in-process on an H100 in sorted batches of 128 (few
distinct input shapes), but 693/s over HTTP, where the service cuts requests into batches of at
most max_batch_size sentences and max_batch_tokens, so that the input shape (rows, length)
changes from batch to batch; the CPU provider shows no such gap. On an H200 these rows found
it: cuDNN's flash attention built a graph for every new shape (now off, docs/decisions.md), and
engines on CUDA pad their runs to a few shapes since. These rows measure the engine
in-process, loaded as the service loads it (its default max_batch_size and max_batch_tokens),
on one seeded sample of STS-dev sentences cut six ways, each row on an engine of its own (its
own CUDA arena and kernel choices):

* fixed shapes (the baseline): batches of ``max_batch_size`` in length order, the same every pass,
  warmed by one pass first;
* random sizes, shapes repeating: random order and batch sizes 1..``max_batch_size``, the same
  draws every pass, warmed by one pass first: what smaller, unsorted batches cost by themselves;
* shape churn: random order and sizes drawn anew every pass, so that new shapes keep coming as
  they do in the service (draws repeated each pass would be warm after the first); the three
  churn rows draw the same sequence;
* shape churn, arena kNextPowerOfTwo: as churn, its session's CUDA arena growing by powers of two
  (onnxruntime's default) instead of as requested (``resolve_providers``'s kSameAsRequested);
  CUDA only;
* shape churn, 2 threads: as churn, two threads calling ``embed`` at once on one session (the
  service's two worker threads), each its share of every pass's batches;
* shape churn, unpadded: as churn, its runs in their own shapes instead of padded to the device's
  few (``DEVICE_SHAPE_STEPS``, what an engine on CUDA does); CUDA only.

Each row is ``embedding.in_process``'s sustained rate, best of the check's rounds, with the number
of distinct shapes its session ran and its mean rows per run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import sts_sentences
from benchmarks.embedding import Lanes, in_process
from benchmarks.gpu.run import DEVICE_VARIANT, GpuRun
from benchmarks.results import Row
from service.artefacts import EMBEDDING_INPUT_IDS
from service.cuda import CUDA
from service.engine import session as engine_session
from service.engine.session import SessionConfig
from service.settings import DEFAULT_EMBED_MODEL, Settings

SEED = 41  # the number: the sample and every row's draws
FIXED = "fixed shapes"
REPEATING = "random sizes, shapes repeating"
CHURN = "shape churn"
POWER_OF_TWO = "kNextPowerOfTwo"
CHURN_ARENA = f"shape churn, arena {POWER_OF_TWO}"
CHURN_THREADS = "shape churn, 2 threads"
CHURN_UNPADDED = "shape churn, unpadded"
READING = (
    "embed shapes, how to read the rows: 'random sizes, shapes repeating' against 'fixed shapes' is "
    "what smaller, unsorted batches cost; 'shape churn' well below 'shapes repeating' is a cost paid "
    f"per new input shape; 'arena {POWER_OF_TWO}' well above 'shape churn' puts that cost on the "
    "CUDA arena's growth (kSameAsRequested); '2 threads' against 'shape churn' is what two worker "
    "threads on one session gain or lose; 'unpadded' against 'shape churn' is what padding runs to "
    "a few shapes (DEVICE_SHAPE_STEPS, service/engine/tokenizer.py) saves on the device. shapes: "
    "distinct (rows, length) inputs the row's session ran; "
    "rows_per_run: its mean rows per run: a rate that falls with rows_per_run, shapes repeating, "
    "is a cost per run rather than per shape."
)

Plan = Callable[[Sequence[str]], list[Sequence[str]]]


def in_order(size: int) -> Plan:
    """Consecutive batches of ``size``: on length-sorted sentences, the same shapes every pass."""
    return lambda sentences: [sentences[i : i + size] for i in range(0, len(sentences), size)]


class RandomBatches:
    """Random order and random batch sizes 1..``largest``: drawn anew on every call, or, with
    ``repeat``, the same draws on every call with the same sentences."""

    def __init__(self, seed: int, largest: int, repeat: bool = False) -> None:
        self.seed, self.largest, self.repeat = seed, largest, repeat
        self._rng = random.Random(seed)

    def __call__(self, sentences: Sequence[str]) -> list[Sequence[str]]:
        rng = random.Random(self.seed) if self.repeat else self._rng
        order = list(sentences)
        rng.shuffle(order)
        batches: list[Sequence[str]] = []
        start = 0
        while start < len(order):
            size = rng.randint(1, self.largest)
            batches.append(order[start : start + size])
            start += size
        return batches


class ShapeLog:
    """Stands in for an engine's session: runs it, noting each run's input shape (rows, length).
    A list, as two threads may append at once."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.shapes: list[tuple[int, ...]] = []

    def run(self, outputs: Any, feeds: dict[str, Any], *args: Any) -> Any:
        self.shapes.append(tuple(feeds[EMBEDDING_INPUT_IDS].shape))
        return self.session.run(outputs, feeds, *args)

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shapes": len(set(self.shapes))}
        if self.shapes:
            out["rows_per_run"] = round(sum(s[0] for s in self.shapes) / len(self.shapes), 1)
        options = self.session.get_provider_options().get(CUDA, {})
        if "arena_extend_strategy" in options:  # read back: the option the session really got
            out["arena"] = options["arena_extend_strategy"]
        return out


class ShapeRun:
    """One row's system for ``in_process``: ``engine`` embedding each pass's sentences in the
    batches ``plan`` cuts, on ``lanes`` threads at once, each its share of the batches."""

    def __init__(self, name: str, engine: Any, plan: Plan, lanes: int = 1) -> None:
        self.name, self.engine, self.plan = name, engine, plan
        self.config = f"{lanes} thread{'s' if lanes > 1 else ''}"
        self.lanes = Lanes(lanes, 1)  # only its threads: the engine's own were set at its load
        self.log = engine.session = ShapeLog(engine.session)

    def embed(self, sentences: Sequence[str]) -> None:
        batches = self.plan(sentences)
        n = self.lanes.n
        self.lanes.run(self._embed_batches, [batches[j::n] for j in range(n)])

    def _embed_batches(self, batches: Sequence[Sequence[str]]) -> None:
        from service.engine.base import EmbedItem

        for batch in batches:
            errors = [r for r in self.engine.embed([EmbedItem(s) for s in batch]) if isinstance(r, Exception)]
            if errors:
                raise errors[0]


@contextmanager
def arena_extend_strategy(strategy: str) -> Iterator[None]:
    """Sessions created inside get ``strategy`` as their CUDA arena_extend_strategy: wraps
    ``resolve_providers`` for the block (no setting of the service's own), restored after."""
    original = engine_session.resolve_providers

    def resolve(pref: str, device_id: int = 0) -> list[Any]:
        return [
            (p[0], {**p[1], "arena_extend_strategy": strategy})
            if isinstance(p, tuple) and p[0] == CUDA
            else p
            for p in original(pref, device_id)
        ]

    engine_session.resolve_providers = resolve
    try:
        yield
    finally:
        engine_session.resolve_providers = original


def service_engine(artefact: Path, provider: str, threads: int) -> Any:
    """The embedding engine as the service loads it with its default batch limits, warmed."""
    from service.engine.loader import load_engine

    defaults = Settings.model_fields
    engine = load_engine(
        artefact,
        SessionConfig(provider, threads),
        max_batch_size=defaults["max_batch_size"].default,
        max_batch_tokens=defaults["max_batch_tokens"].default,
    )
    engine.warmup()
    return engine


def run(gpu: GpuRun, threads: int) -> None:
    """The rows above in one section, ``FIXED`` the baseline; ``threads``: each engine's intra-op
    threads (those of the speed stage's other in-process engines)."""
    artefact = gpu.artefacts / DEFAULT_EMBED_MODEL / DEVICE_VARIANT
    largest: int = Settings.model_fields["max_batch_size"].default

    def engine() -> Any:
        return service_engine(artefact, gpu.provider, threads)

    fixed = ShapeRun(FIXED, engine(), in_order(largest))
    every = sts_sentences(gpu.data_dir)
    sample = random.Random(SEED).sample(every, min(gpu.sizes.shape_sentences, len(every)))
    sentences = sorted(sample, key=fixed.engine.count_tokens)
    systems = [
        fixed,
        ShapeRun(REPEATING, engine(), RandomBatches(SEED, largest, repeat=True)),
        ShapeRun(CHURN, engine(), RandomBatches(SEED, largest)),
    ]
    if gpu.provider == "cuda":
        with arena_extend_strategy(POWER_OF_TWO):
            systems.append(ShapeRun(CHURN_ARENA, engine(), RandomBatches(SEED, largest)))
    else:
        gpu.results.note(f"{CHURN_ARENA}: not measured, arena_extend_strategy is a CUDA option")
    systems.append(ShapeRun(CHURN_THREADS, engine(), RandomBatches(SEED, largest), lanes=2))
    if gpu.provider == "cuda":
        unpadded = engine()
        unpadded.sub_batches = replace(unpadded.sub_batches, shape_steps=(1, 1))
        systems.append(ShapeRun(CHURN_UNPADDED, unpadded, RandomBatches(SEED, largest)))
    else:
        gpu.results.note(f"{CHURN_UNPADDED}: not measured, the CPU's engines do not pad")
    for repeating in systems[:2]:
        repeating.embed(sentences)  # their shapes warm before the runs
    measured = in_process(systems, sentences, gpu.sizes.rounds, gpu.sizes.shape_seconds)
    section = f"embed shapes ({gpu.device_label}): sentences/s, {len(sentences)} STS-dev sentences"
    for system in systems:
        rate = measured[system.name].sentences_per_s
        gpu.results.add(Row(section, system.name, rate, "sent/s", system is fixed, extra=system.log.extra()))
    gpu.results.note(READING)
