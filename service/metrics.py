"""Every Prometheus object of the service, in one place.

Label values come only from fixed sets (endpoint route templates, status codes the service
emits, model names from loaded manifests, stage names below), never from client input.

With several serving processes (``TSERVE_WORKERS``) every process writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode, set up by
``service/http/workers.py``) and ``/metrics`` adds them up: counters and histograms over every
process that ever served, those of a replaced one included, as a single process's would; each
gauge over the live processes by its ``multiprocess_mode``, chosen below for what it says about
the host (one process alone: the modes change nothing).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.context_managers import Timer
from prometheus_client.metrics import MetricWrapperBase

PREFIX = "tserve"
M = TypeVar("M", bound=MetricWrapperBase)
Stage = Literal["tokenize", "queue", "encoder", "decoder", "pool", "detokenize", "total"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)

REQUESTS = Counter(f"{PREFIX}_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"])
REQUEST_LATENCY = Histogram(
    f"{PREFIX}_request_duration_seconds", "HTTP request latency", ["endpoint"], buckets=_LATENCY_BUCKETS
)
STAGE_LATENCY = Histogram(
    f"{PREFIX}_stage_duration_seconds",
    "Time per pipeline stage (tokenize, queue, encoder, decoder, pool, detokenize, total)",
    ["model", "stage"],
    buckets=_LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(f"{PREFIX}_batch_size", "Items per engine batch", ["model"], buckets=_SIZE_BUCKETS)
BATCH_TOKENS = Histogram(
    f"{PREFIX}_batch_tokens", "Input tokens per engine batch", ["model"], buckets=_TOKEN_BUCKETS
)
# The host's: items waiting in all its processes' queues (what the autoscaler divides by pods).
QUEUE_DEPTH = Gauge(
    f"{PREFIX}_queue_depth", "Items waiting in the request queue", ["model"], multiprocess_mode="livesum"
)
INPUT_TOKENS = Counter(f"{PREFIX}_input_tokens", "Input tokens processed", ["model"])
OUTPUT_TOKENS = Counter(f"{PREFIX}_output_tokens", "Output tokens generated", ["model"])
REJECTED = Counter(f"{PREFIX}_rejected", "Items refused before queueing", ["model", "reason"])
DROPPED = Counter(
    f"{PREFIX}_dropped",
    "Items dropped because nobody waits for them (client gone, deadline): queued ones before "
    "inference, running ones at the engine's next step",
    ["model", "reason"],
)
ITEM_ERRORS = Counter(f"{PREFIX}_item_errors", "Items that failed inside a batch", ["model"])
CONSTRAINED_SENTENCES = Counter(
    f"{PREFIX}_constrained_sentences",
    "Sentences with required phrases (glossary terms, kept spans) by the search whose result they "
    "got: free (its best hypotheses held every phrase), placed (searched again with the phrases put "
    "where the free translation's alignment says) or constrained (searched again under them)",
    ["model", "search"],
)
# Still 1 however many processes load the model: the largest, not the sum.
MODEL_INFO = Gauge(
    f"{PREFIX}_model_info",
    "Loaded models (value 1)",
    ["model", "task", "variant", "provider"],
    multiprocess_mode="livemax",
)
# The host is ready only when its least ready process is.
READY = Gauge(
    f"{PREFIX}_ready", "1 when every model is loaded, verified and warmed up", multiprocess_mode="livemin"
)
# Amounts in flight or held: the host's are its processes' sums.
INFLIGHT = Gauge(f"{PREFIX}_inflight_requests", "HTTP requests being served", multiprocess_mode="livesum")
DECODE_RUNNING = Gauge(
    f"{PREFIX}_decode_running_sentences",
    "Sentences in the running decode (continuous batching)",
    ["model"],
    multiprocess_mode="livesum",
)
DECODE_FREE_ROWS = Gauge(
    f"{PREFIX}_decode_free_rows",
    "Decoder rows (sentences × beams) the decode memory budget still allows at the model's longest output",
    ["model"],
    multiprocess_mode="livesum",  # each process has its own budget
)
DECODE_STEP = Histogram(
    f"{PREFIX}_decode_step_seconds",
    "One decoder step over every running row (continuous batching)",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
ADMITTED_PER_STEP = Histogram(
    f"{PREFIX}_decode_admitted_sentences",
    "Sentences admitted into the running decode between two steps (when any are)",
    ["model"],
    buckets=_SIZE_BUCKETS,
)
LANGUAGE_DETECTIONS = Counter(
    f"{PREFIX}_language_detections",
    "Texts whose language was detected (/detect, source auto), by the language found: a served "
    "one, else other (not served, or no letter to tell)",
    ["language"],
)


def exposition(processes: int) -> bytes:
    """``/metrics``'s text: this process's registry, or with several serving processes every
    process's values added up (read from their files at each scrape)."""
    if processes == 1:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}


def labelled(metric: M, *values: str) -> M:
    """``metric.labels(*values)``, remembered: ``labels`` takes the metric's lock on every call,
    and the hot path updates the same few children for every request. Label values come from
    fixed sets (see above), so the cache stays small."""
    key = (metric, values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def observe_stage(model: str, stage: Stage, seconds: float) -> None:
    labelled(STAGE_LATENCY, model, stage).observe(seconds)


def observe_stages(model: str, stage: Stage, seconds: Iterable[float]) -> None:
    """``observe_stage`` of each of ``seconds`` (a batch's items)."""
    observe_many(labelled(STAGE_LATENCY, model, stage), seconds)


def observe_many(histogram: Histogram, amounts: Iterable[float]) -> None:
    """Each of ``amounts`` observed into a histogram's child, as many ``observe`` calls would,
    equal amounts at once: a batch's items of one request waited the same, and each ``observe``
    takes two locks. The same count, buckets and sum (up to the sum's rounding)."""
    bounds = histogram._upper_bounds
    for amount, times in Tally(amounts).items():
        histogram._sum.inc(amount * times)
        histogram._buckets[bisect_left(bounds, amount)].inc(times)


def timed(model: str, stage: Stage) -> Timer:
    """Time a block (``with``) into the stage histogram."""
    return labelled(STAGE_LATENCY, model, stage).time()


# The translation cache (service/serving/cache.py): one per process, shared by every model.
CACHE_HITS = Counter(
    f"{PREFIX}_translation_cache_hits", "Sentences answered from the translation cache", ["model"]
)
CACHE_MISSES = Counter(
    f"{PREFIX}_translation_cache_misses",
    "Sentences looked up in the translation cache and not found",
    ["model"],
)
CACHE_BYTES = Gauge(
    f"{PREFIX}_translation_cache_bytes",
    "Bytes the translation cache holds (its entries' objects)",
    multiprocess_mode="livesum",  # one cache per process: the host's memory is their sum
)
CACHE_EVICTIONS = Counter(
    f"{PREFIX}_translation_cache_evictions",
    "Least recently used entries dropped to stay within the byte bound",
)

# Per-key quotas (service/serving/quotas.py): labelled by the limit, never by the key, so the
# series stay as few as the limits however many keys there are.
QuotaLimit = Literal["requests_per_minute", "characters_per_minute", "characters_per_day"]
QUOTA_REJECTIONS = Counter(f"{PREFIX}_quota_rejections", "Requests refused by their key's quota", ["limit"])
QUOTA_USAGE = Histogram(
    f"{PREFIX}_quota_usage_ratio",
    "Share of its limit a key has used, observed at each request charged to it",
    ["limit"],
    buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0),
)

# File translation (service/files): labelled by the format's extension as the registry knows it
# ("other" for any other name) and the outcome: "ok", or the refusal's error type, a fixed set.
FILES = Counter(
    f"{PREFIX}_files",
    "Files sent to translation, by format and outcome (ok, or the error type answered)",
    ["format", "outcome"],
)
FILE_BYTES = Histogram(
    f"{PREFIX}_file_bytes",
    "Size of each file sent to translation, refused ones included",
    ["format"],
    buckets=tuple(float(1 << shift) for shift in range(10, 27, 2)),  # 1 KiB to 64 MiB, ×4
)
