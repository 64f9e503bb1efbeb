"""Stage speed of the GPU check: our fp16 models on the device against what users would run there.

* translation (en→de), beam 4, batches of 32, 64 and 128: target tokens/s of Hugging Face
  ``generate`` in fp16 (the baseline), our engine in-process on whole batches, the same engine
  decoding continuously (every sentence in one call, at most a batch's worth at once: sentences
  join as others finish where the engine can admit them into a running decode), and our service
  over HTTP (one request per batch); BLEU of each run's outputs beside it;
* one short sentence at a time (beam 4): latency of each;
* embeddings, batches of 128: sentences/s of sentence-transformers in fp16 (the baseline) and our
  engine in-process, and our service over HTTP with 4 clients sending 128 sentences a request;
* embedding shapes (``shapes``): our engine in-process on sorted batches against batches
  whose input shapes keep changing, as the service's do, with the CUDA arena's growth and the
  CPU's cut of batches as variants;
* dynamic batching against the same service with a batch size of 1, over HTTP: many clients, one
  sentence per request, so only the batcher can put requests together; for embeddings also the
  device service running one batch at a time (one worker thread and no express worker: by default
  two worker threads and the express one share each model's session), which tells whether batches
  running at once on one CUDA session cost more than they gain.

Every HTTP row carries the server's own account of its run (benchmarks/server_account.py: batches,
items per batch, milliseconds per batch of each engine stage, how busy the engine was), and so does
our in-process embedding row, from this process's metrics. The embeddings over HTTP and the
dynamic batching of embeddings are profiled with py-spy during their first round
(benchmarks/server_profile.py): the top frames go into the notes, the heaviest stacks into
logs.txt, the raw recordings (``py-spy-*.txt``) into the results folder.

The figures are checked against the issue's goals (benchmarks/gpu/goals.py). The translation and
embedding runs reuse the CPU stages' timing (``timed_pass.throughput``, ``translation.latencies``,
``embedding.in_process``, ``serving.load_row``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from benchmarks.common import Service, percentiles_ms, sts_sentences
from benchmarks.embedding import InProcessRun, in_process
from benchmarks.gpu import shapes, step_profile
from benchmarks.gpu.baselines import (
    HFGenerateOnDevice,
    SentenceTransformersOnDevice,
    ctranslate2_on_cuda,
    embedding_model_dir,
    translation_checkpoint,
)
from benchmarks.gpu.goals import batching_goal, embedding_goal, translation_goals
from benchmarks.gpu.ours import BEAM, ENGINE_THREADS, EmbedOnDevice, OursOnDevice
from benchmarks.gpu.quality import split_sentences
from benchmarks.gpu.run import DEVICE_VARIANT, GpuRun
from benchmarks.loadgen import BodyFactory
from benchmarks.results import Row
from benchmarks.server_account import RoundObserver, accounted, local, scrape
from benchmarks.server_profile import PySpy
from benchmarks.serving import load_row
from benchmarks.timed_pass import Run, throughput
from benchmarks.translation import bleu, latencies
from benchmarks.translators import OursHTTP, TextCodec, Translator, Workload
from service.artefacts import read_manifest
from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS

TRANSLATOR = DEFAULT_TRANSLATE_MODELS[0]  # en→de
EMBED_CLIENTS, TRANSLATE_CLIENTS = 64, 16  # one sentence per request each
ONE_AT_A_TIME = "dynamic batching, one batch at a time (1 worker thread, no express)"
PROFILE_MARGIN_S = 1.0  # py-spy records the first round's warm-up requests too


def best_pass(system: Translator, texts: Sequence[str], batch: int, codec: TextCodec, rounds: int) -> Run:
    runs = [
        throughput(system, texts, Workload(BEAM, batch, 0, False), codec, warm_up=r == 0)
        for r in range(rounds)
    ]
    return max(runs, key=lambda run: run.tokens_per_s)


def translation(gpu: GpuRun, device_service: Service | None) -> None:
    artefact = gpu.artefacts / TRANSLATOR / DEVICE_VARIANT
    manifest = read_manifest(artefact)
    special = manifest.special_ids
    assert special.eos is not None and special.pad is not None, "a translation artefact names both"
    codec = TextCodec(artefact / manifest.tokenizer, eos_id=special.eos, pad_id=special.pad)
    texts, references = split_sentences(gpu.data_dir, "en", "de", gpu.sizes.translate_sentences)
    checkpoint = translation_checkpoint(TRANSLATOR)
    ours = OursOnDevice(artefact, gpu.provider, f"ours in-process, whole batches ({gpu.device_label})")
    systems: list[Translator] = [ours]
    if checkpoint.is_file():
        systems.insert(0, HFGenerateOnDevice(checkpoint, codec, gpu.provider))
    else:
        gpu.results.note(f"HF generate not measured: no checkpoint at {checkpoint}")
    if device_service is not None:
        systems.append(OursHTTP(device_service.base, device_service.pid, f"ours HTTP ({gpu.device_label})"))
    if (why := ctranslate2_on_cuda()) is not None:
        gpu.results.note(why)
    continuous_name = f"ours in-process, continuous ({gpu.device_label})"
    best: dict[tuple[str, int], float] = {}
    for batch in gpu.sizes.batches:
        section = f"translate en→de, beam {BEAM}, batch {batch}: target tokens/s, {len(texts)} sentences"
        for system in systems:
            rounds = 1 if isinstance(system, HFGenerateOnDevice) else gpu.sizes.rounds
            with account_of(system, device_service) as columns:
                run = best_pass(system, texts, batch, codec, rounds)
            best[system.name, batch] = run.tokens_per_s
            extra = {"bleu": round(bleu(run.outputs, references), 2), "seconds": round(run.seconds, 2)}
            extra |= columns
            row = Row(
                section, system.name, run.tokens_per_s, "tok/s", baseline=system is systems[0], extra=extra
            )
            gpu.results.add(row)
        rate, outputs = max(ours.continuous(texts, batch, codec) for _ in range(gpu.sizes.rounds))
        best[continuous_name, batch] = rate
        extra = {"bleu": round(bleu(outputs, references), 2), "joins_midway": ours.engine.joins_midway}
        gpu.results.add(Row(section, continuous_name, rate, "tok/s", extra=extra))
    short = [s for s in texts if len(s.split()) <= 8][: gpu.sizes.short_requests] or texts[:1]
    section = f"translate en→de: one short sentence at a time, beam {BEAM}, {len(short)} × {gpu.sizes.rounds}"
    short_p50_ms = None
    for name, (seconds, _) in latencies(systems, short, BEAM, codec, gpu.sizes.rounds).items():
        p = percentiles_ms(seconds)
        short_p50_ms = p["p50_ms"] if name == ours.name else short_p50_ms
        row = Row(
            section, name, p["p50_ms"], "ms p50", baseline=name == systems[0].name, higher_is_better=False
        )
        row.extra["p99_ms"] = round(p["p99_ms"], 1)
        gpu.results.add(row)
    http = systems[-1].name if isinstance(systems[-1], OursHTTP) else None
    translation_goals(gpu, best, (ours.name, continuous_name), http, short_p50_ms)


def account_of(system: Translator, service: Service | None) -> AbstractContextManager[dict[str, Any]]:
    """The server's account of a run of ``system`` when it is our service over HTTP."""
    if service is not None and isinstance(system, OursHTTP):
        return accounted(lambda: scrape(service.base))
    return nullcontext({})


def observer(gpu: GpuRun, service: Service, profile_as: str | None = None) -> RoundObserver:
    """For ``load_row``: each round accounted by ``service``; with ``profile_as``, its first
    round recorded by py-spy as well (``GpuRun.record_profile``)."""

    @contextmanager
    def observe(round_index: int) -> Iterator[dict[str, Any]]:
        if profile_as is None or round_index > 0:
            with accounted(lambda: scrape(service.base)) as columns:
                yield columns
            return
        raw = gpu.out / f"py-spy-{re.sub(r'[^a-z0-9]+', '-', profile_as.lower()).strip('-')}.txt"
        # accounted inside: the account's window ends with the load, not with py-spy's recording
        with (
            PySpy(service.pid, gpu.sizes.http_seconds + PROFILE_MARGIN_S, raw) as spy,
            accounted(lambda: scrape(service.base)) as columns,
        ):
            yield columns
        gpu.record_profile(profile_as, spy)

    return observe


def embeddings(gpu: GpuRun, device_service: Service | None) -> None:
    sentences = sts_sentences(gpu.data_dir)[: gpu.sizes.embed_sentences]
    batch = gpu.sizes.embed_batch
    artefact = gpu.artefacts / DEFAULT_EMBED_MODEL / DEVICE_VARIANT
    ours = EmbedOnDevice(artefact, gpu.provider, batch, f"ours in-process ({gpu.device_label})")
    source = embedding_model_dir()
    systems: list[Any] = [ours]
    if source.is_dir():
        systems.insert(0, SentenceTransformersOnDevice(source, gpu.provider, batch))
    else:
        gpu.results.note(f"sentence-transformers not measured: no model at {source}")
    section = f"embed, batch {batch}: sentences/s, {len(sentences)} STS-dev sentences"
    measured: dict[str, InProcessRun] = {}
    accounts: dict[str, dict[str, Any]] = {}
    for system in systems:  # one after the other: our engine's account is of its own runs
        account: AbstractContextManager[dict[str, Any]] = (
            accounted(local) if system is ours else nullcontext({})
        )
        with account as accounts[system.name]:
            measured |= in_process([system], sentences, gpu.sizes.rounds, gpu.sizes.embed_seconds)
    for system in systems:
        run = measured[system.name]
        extra = {"config": run.config} | accounts[system.name]
        gpu.results.add(
            Row(section, system.name, run.sentences_per_s, "sent/s", system is systems[0], extra=extra)
        )
    over_http = None
    if device_service is not None:
        n = len(sentences)

        def body(i: int) -> dict[str, Any]:
            return {"input": [sentences[(i * batch + j) % n] for j in range(batch)]}

        url = f"{device_service.base}/v1/embeddings"
        over_http = load_row(
            gpu.results,
            section,
            f"ours HTTP, 4 clients × {batch} sentences ({gpu.device_label})",
            url,
            body,
            [device_service.pid],
            clients=4,
            items=batch,
            duration_s=gpu.sizes.http_seconds,
            rounds=gpu.sizes.rounds,
            observe=observer(gpu, device_service, f"embeddings over HTTP, 4 clients × {batch} sentences"),
        )
    embedding_goal(gpu, batch, over_http, measured[ours.name].sentences_per_s)


def batching(gpu: GpuRun, device_service: Service) -> None:
    """The device's service against the same on one sentence per batch, clients sending one each;
    for embeddings, also the device's service running one batch at a time."""
    serial = gpu.service(
        DEVICE_VARIANT,
        gpu.provider,
        "batch-size-1",
        [TRANSLATOR],
        DEFAULT_EMBED_MODEL,
        TSERVE_MAX_BATCH_SIZE="1",
    )
    try:
        one_at_a_time = gpu.service(
            DEVICE_VARIANT,
            gpu.provider,
            "one-batch-at-a-time",
            [],
            DEFAULT_EMBED_MODEL,
            **gpu.device_settings(),
            TSERVE_WORKER_THREADS="1",
            TSERVE_EXPRESS_MAX_TOKENS="0",
        )
    except Exception:
        serial.stop()
        raise
    sentences = sts_sentences(gpu.data_dir)
    texts, _ = split_sentences(gpu.data_dir, "en", "de", None)
    short = [s for s in texts if len(s.split()) <= 10]
    scale = 4 if gpu.args.quick else 1  # fewer clients for the CPU's small run
    tasks: list[tuple[str, str, int, BodyFactory]] = [
        (
            "embed",
            "/v1/embeddings",
            EMBED_CLIENTS // scale,
            lambda i: {"input": [sentences[i % len(sentences)]]},
        ),
        (
            f"translate (beam {BEAM})",
            "/v1/translate",
            TRANSLATE_CLIENTS // scale,
            lambda i: {"text": [short[i % len(short)]], "beam_size": BEAM, "model": TRANSLATOR},
        ),
    ]
    try:
        for task, path, clients, body in tasks:
            section = f"serving ({gpu.device_label}): {task}, {clients} clients × 1 sentence/request"
            systems = [("batch size 1", serial), ("dynamic batching", device_service)]
            if path == "/v1/embeddings":
                systems.append((ONE_AT_A_TIME, one_at_a_time))
            rows = {}
            for system, service in systems:
                profiled = service is device_service and path == "/v1/embeddings"
                rows[system] = load_row(
                    gpu.results,
                    section,
                    system,
                    f"{service.base}{path}",
                    body,
                    [service.pid],
                    clients=clients,
                    items=1,
                    duration_s=gpu.sizes.http_seconds,
                    rounds=gpu.sizes.rounds,
                    baseline=service is serial,
                    observe=observer(gpu, service, f"{section}, {system}" if profiled else None),
                )
            batching_goal(gpu, task, rows["dynamic batching"], rows["batch size 1"])
    finally:
        serial.stop()
        one_at_a_time.stop()


def run(gpu: GpuRun, device_service: Service | None) -> None:
    gpu.guard("speed: translation", translation, gpu, device_service)
    gpu.guard("speed: embeddings", embeddings, gpu, device_service)
    gpu.guard("speed: embedding shapes", shapes.run, gpu, ENGINE_THREADS)
    gpu.guard("speed: decoder steps", step_profile.run, gpu)
    if device_service is not None:
        gpu.guard("speed: dynamic batching vs batch size 1", batching, gpu, device_service)
