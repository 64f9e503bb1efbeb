"""Stage quality of the GPU check: the served models' quality over HTTP, fp16 on the device against
fp32 and int8 on the CPU.

sacreBLEU on Multi30k ``test_2016_flickr`` in both directions (each translator at beam 4 with its
own length penalty, batched requests as ``benchmarks.service_bleu`` sends them) and the STS-dev
Spearman correlation of the embeddings' cosine similarities (× 100, as the model card gives it).
fp16 must stay within ``BLEU_TOLERANCE`` BLEU and ``SPEARMAN_TOLERANCE`` points of fp32: the
issue's acceptance.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import Service, read_lines
from benchmarks.gpu.run import DEVICE_VARIANT, GpuRun
from benchmarks.results import Row
from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS

BLEU_TOLERANCE = 0.3
SPEARMAN_TOLERANCE = 0.1  # points of Spearman × 100
SPLIT = "test_2016_flickr"
REQUEST_SENTENCES = 32  # sentences per request
CONCURRENT_REQUESTS = 4


@dataclass(frozen=True)
class Served:
    label: str
    variant: str
    provider: str


def compared(provider: str) -> list[Served]:
    """The device's variant first, then the CPU variants it is compared with."""
    device = "CUDA" if provider == "cuda" else "CPU"
    return [
        Served(f"{DEVICE_VARIANT} on {device}", DEVICE_VARIANT, provider),
        Served("fp32 on CPU", "fp32", "cpu"),
        Served("int8 on CPU", "int8", "cpu"),
    ]


def split_sentences(data_dir: Path, source: str, target: str, n: int | None) -> tuple[list[str], list[str]]:
    """The first ``n`` (None: all) sentences of the split and their references."""
    sources = read_lines(data_dir / "multi30k" / f"{SPLIT}.{source}.gz")[:n]
    return sources, read_lines(data_dir / "multi30k" / f"{SPLIT}.{target}.gz")[: len(sources)]


def bleu_over_http(base: str, model: str, data_dir: Path, n: int | None) -> tuple[str, float, float]:
    """(language pair, sacreBLEU, seconds) of ``model``'s translations of the split's first ``n``
    sentences through the service at ``base``, in its card's direction and length penalty."""
    import sacrebleu

    from benchmarks.service_bleu import served_translator, service_translations  # imports torch

    with httpx.Client(base_url=base, timeout=600) as client:
        card = served_translator(client, model)
        pair = card["source_languages"][0], card["target_languages"][0]
        sources, references = split_sentences(data_dir, *pair, n)
        options = argparse.Namespace(
            batch=REQUEST_SENTENCES,
            concurrency=CONCURRENT_REQUESTS,
            beam=4,
            length_penalty=card.get("length_penalty") or 1.0,
            model=card["id"],
        )
        start = time.perf_counter()
        translations = service_translations(client, sources, options)
        seconds = time.perf_counter() - start
    return "→".join(pair), sacrebleu.corpus_bleu(translations, [references]).score, seconds


def sts_pairs(data_dir: Path, n: int | None) -> tuple[list[str], list[str], np.ndarray]:
    """The first ``n`` (None: all) STS-dev pairs: both sentences and the gold score."""
    first, second, gold = [], [], []
    for line in read_lines(data_dir / "stsb" / "sts-dev.csv"):
        parts = line.split("\t")
        if len(parts) >= 7:
            first.append(parts[5].strip())
            second.append(parts[6].strip())
            gold.append(float(parts[4]))
    return first[:n], second[:n], np.asarray(gold[:n])


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (as Spearman's coefficient wants)."""
    order = np.argsort(x, kind="stable")
    ranked = np.empty(len(x))
    ranked[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranked, minlength=len(values))
    return (sums / np.bincount(inverse, minlength=len(values)))[inverse]


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    return float(np.corrcoef(ranks(np.asarray(x)), ranks(np.asarray(y)))[0, 1])


def embed_over_http(base: str, sentences: Sequence[str], per_request: int = 64) -> np.ndarray:
    """(len(sentences), dim) float32 from ``POST /v1/embeddings``, in order."""
    chunks = [list(sentences[i : i + per_request]) for i in range(0, len(sentences), per_request)]

    def embed(chunk: list[str]) -> list[list[float]]:
        response = client.post("/v1/embeddings", json={"input": chunk})
        response.raise_for_status()
        data = sorted(response.json()["data"], key=lambda d: d["index"])
        return [d["embedding"] for d in data]

    with httpx.Client(base_url=base, timeout=600) as client, ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        return np.asarray([v for vectors in pool.map(embed, chunks) for v in vectors], dtype=np.float32)


def sts_spearman(base: str, data_dir: Path, n: int | None) -> float:
    """Spearman × 100 of the cosine similarities of the embeddings served at ``base``."""
    first, second, gold = sts_pairs(data_dir, n)
    a, b = embed_over_http(base, first), embed_over_http(base, second)
    cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return 100 * spearman(cosine, gold)


def measure(gpu: GpuRun, served: Served, service: Service, scores: dict[str, dict[str, float]]) -> None:
    """BLEU of every default translator and the STS Spearman of the embedder, served by ``service``."""
    mine = scores.setdefault(served.label, {})
    for model in DEFAULT_TRANSLATE_MODELS:
        pair, bleu, seconds = bleu_over_http(service.base, model, gpu.data_dir, gpu.sizes.bleu_sentences)
        n = gpu.sizes.bleu_sentences or 1000
        mine[pair] = bleu
        section = f"quality: sacreBLEU, {SPLIT} {pair}, beam 4, {n} sentences over HTTP"
        gpu.results.add(Row(section, served.label, bleu, "BLEU", extra={"seconds": round(seconds, 1)}))
    spearman_points = sts_spearman(service.base, gpu.data_dir, gpu.sizes.sts_pairs)
    mine["sts"] = spearman_points
    pairs = gpu.sizes.sts_pairs or 1500
    section = f"quality: STS-dev Spearman × 100, {pairs} pairs, cosine of /v1/embeddings"
    gpu.results.add(Row(section, served.label, spearman_points, "Spearman"))


def judge(gpu: GpuRun, scores: dict[str, dict[str, float]]) -> None:
    """The acceptance: the device variant within the tolerances of fp32 on the CPU."""
    device, fp32 = (s.label for s in compared(gpu.provider)[:2])
    ours, base = scores.get(device, {}), scores.get(fp32, {})
    pairs = [k for k in base if k != "sts"] or ["en→de", "de→en"]
    for pair in pairs:
        if pair in ours and pair in base:
            gap = ours[pair] - base[pair]
            detail = f"{ours[pair]:.2f} against {base[pair]:.2f} (Δ {gap:+.2f}, at most ±{BLEU_TOLERANCE})"
            gpu.verdict(f"BLEU {pair}: {device} vs fp32", abs(gap) <= BLEU_TOLERANCE, detail)
        else:
            gpu.verdict(f"BLEU {pair}: {device} vs fp32", None, "not measured (see the notes)")
    if "sts" in ours and "sts" in base:
        gap = ours["sts"] - base["sts"]
        detail = f"{ours['sts']:.2f} against {base['sts']:.2f} (Δ {gap:+.2f}, at most ±{SPEARMAN_TOLERANCE})"
        gpu.verdict(f"STS-dev Spearman: {device} vs fp32", abs(gap) <= SPEARMAN_TOLERANCE, detail)
    else:
        gpu.verdict(f"STS-dev Spearman: {device} vs fp32", None, "not measured (see the notes)")


def run(gpu: GpuRun, device_service: Service | None) -> None:
    """The device's service (already running, shared with the speed stage), then a CPU service of
    each CPU variant in turn."""
    scores: dict[str, dict[str, float]] = {}
    device, *cpu = compared(gpu.provider)
    if device_service is not None:
        gpu.guard(f"quality of {device.label}", measure, gpu, device, device_service, scores)
    for served in cpu:
        service = gpu.guard(
            f"start the {served.label} service",
            gpu.service,
            served.variant,
            served.provider,
            served.variant + "-cpu",
            DEFAULT_TRANSLATE_MODELS,
            DEFAULT_EMBED_MODEL,
        )
        if service is None:
            continue
        try:
            gpu.guard(f"quality of {served.label}", measure, gpu, served, service, scores)
        finally:
            service.stop()
    judge(gpu, scores)
