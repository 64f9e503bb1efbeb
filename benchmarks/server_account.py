"""The server's own account of a measured run: what its Prometheus metrics (service/metrics.py)
moved by between a reading before the run and one after it.

Columns it adds to a row (each only where the run moved the metrics it comes from; every model's
series summed, as a run loads one model):

* ``batches``: engine batches run (``tserve_batch_size``; where no queue counts them, an
  engine called directly, its calls: the ``tokenize`` stage's count), ``items_per_batch``;
* ``<stage>_ms_per_batch``: milliseconds per batch in each engine stage (tokenize, encoder, pool,
  decoder, detokenize of ``tserve_stage_duration_seconds``);
* ``queue_ms_per_item``: how long an item waited in the model's request queue, on average;
* ``decode_steps``, ``ms_per_step``, ``sentences_per_admission``: continuous decoding's steps
  (``tserve_decode_step_seconds``) and admissions (``tserve_decode_admitted_sentences``);
* ``engine_busy``: the engine stages' seconds over the window's wall seconds, i.e. how many engine
  runs were in progress on average (2 worker threads busy all the time: 2.0). Far below the
  workers' count while clients wait, the time goes outside the engine (HTTP, JSON, the event loop).

The window covers the whole run, a load run's warm-up round included: the figures are means per
batch and per item, which that round hardly moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]
RoundObserver = Callable[[int], AbstractContextManager[dict[str, Any]]]  # round index → its columns

ENGINE_STAGES = ("tokenize", "encoder", "pool", "decoder", "detokenize")
_STAGE = "tserve_stage_duration_seconds"
_BATCH = "tserve_batch_size"
_STEP = "tserve_decode_step_seconds"
_ADMITTED = "tserve_decode_admitted_sentences"


@dataclass(frozen=True)
class Snapshot:
    samples: Samples
    at: float  # time.perf_counter() when read


def _samples(families: Iterable[Any]) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families
        for sample in family.samples
    }


def scrape(base_url: str, timeout_s: float = 10.0) -> Snapshot:
    """The service's ``GET /metrics``, parsed."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=timeout_s).raise_for_status().text
    return Snapshot(_samples(text_string_to_metric_families(text)), time.perf_counter())


def local() -> Snapshot:
    """This process's own registry: our engines called in-process observe the same metrics."""
    from prometheus_client import REGISTRY

    return Snapshot(_samples(REGISTRY.collect()), time.perf_counter())


def _moved(before: Snapshot, after: Snapshot, name: str, **labels: str) -> float:
    """How much the samples named ``name`` whose labels include ``labels`` grew, summed."""
    want = set(labels.items())
    total = 0.0
    for (sample, sample_labels), value in after.samples.items():
        if sample == name and want <= sample_labels:
            total += value - before.samples.get((sample, sample_labels), 0.0)
    return total


def account(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """The columns of the module doc for the window between two readings."""

    def moved(name: str, **labels: str) -> float:
        return _moved(before, after, name, **labels)

    out: dict[str, Any] = {}
    counted = moved(f"{_BATCH}_count")
    batches = counted or moved(f"{_STAGE}_count", stage="tokenize")
    busy = 0.0
    if batches:
        out["batches"] = int(batches)
        if counted:
            out["items_per_batch"] = round(moved(f"{_BATCH}_sum") / counted, 1)
        for stage in ENGINE_STAGES:
            seconds = moved(f"{_STAGE}_sum", stage=stage)
            busy += seconds
            if moved(f"{_STAGE}_count", stage=stage):
                out[f"{stage}_ms_per_batch"] = round(1000 * seconds / batches, 2)
    if queued := moved(f"{_STAGE}_count", stage="queue"):
        out["queue_ms_per_item"] = round(1000 * moved(f"{_STAGE}_sum", stage="queue") / queued, 2)
    if steps := moved(f"{_STEP}_count"):
        step_seconds = moved(f"{_STEP}_sum")
        busy += step_seconds
        out["decode_steps"] = int(steps)
        out["ms_per_step"] = round(1000 * step_seconds / steps, 2)
    if admissions := moved(f"{_ADMITTED}_count"):
        out["sentences_per_admission"] = round(moved(f"{_ADMITTED}_sum") / admissions, 1)
    if busy and after.at > before.at:
        out["engine_busy"] = round(busy / (after.at - before.at), 2)
    return out


@contextmanager
def accounted(read: Callable[[], Snapshot]) -> Iterator[dict[str, Any]]:
    """The account of the block, in the dict yielded (filled when the block ends); a reading that
    fails leaves ``server_account`` saying why instead of failing the measurement."""
    columns: dict[str, Any] = {}
    try:
        before = read()
    except Exception as e:
        columns["server_account"] = f"unavailable: {type(e).__name__}: {str(e)[:100]}"
        yield columns
        return
    yield columns
    try:
        columns.update(account(before, read()))
    except Exception as e:
        columns["server_account"] = f"unavailable: {type(e).__name__}: {str(e)[:100]}"


def of_service(base_url: str) -> RoundObserver:
    """For ``serving.load_row``: every round accounted by the service at ``base_url``."""
    return lambda _round: accounted(lambda: scrape(base_url))
