"""sacreBLEU of a running service's translations against the PyTorch checkpoint's own.

python -m benchmarks.service_bleu --url http://localhost:8000 --data-dir path/to/data/multi30k \\
    [--model transformer-de-en] [--split test_2016_flickr] [--beam 4] [--checkpoint PATH.safetensors] \\
    [--documents 50]

``--model`` picks one of the served translators (default: the service's default); its card's
languages pick the data files and its name the repository checkpoint. The test split goes
through ``POST /v1/translate`` in batched requests, several in flight; the checkpoint translates
it in PyTorch with ``export.sources.ours.translate.translate``, as ``export.training.evaluate``
(the model card's figure) does. Both are scored with ``sacrebleu.BLEU()``'s defaults (cased,
13a, detokenised text). Exit status 1 when they differ by more than ``--tolerance`` BLEU: the
served artefact (export, variant, search) does not translate like its checkpoint. Point it at
the service of the same checkpoint; the service's batching and the PyTorch run take a while, so
give the service a long ``TSERVE_REQUEST_TIMEOUT_S`` on a busy machine.

With ``--documents N`` the reference is the service itself: the split sent one line per item
against the same lines sent as documents of N lines (joined by line breaks, split back after),
which must score the same: sentence segmentation and batching may not change a translation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import sacrebleu
import torch
from tokenizers import Tokenizer

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import read_parallel
from export.sources.ours.translate import DEFAULT_CHECKPOINT, translate

RETRIES_ON_429 = 20


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.service_bleu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", default="http://localhost:8000", help="the running service")
    p.add_argument("--data-dir", type=Path, required=True, help="Multi30k: {split}.en[.gz], {split}.de[.gz]")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=4, help="beam size for both (1 = greedy)")
    p.add_argument(
        "--length-penalty", type=float, help="for both (default: the served model's, GET /v1/models)"
    )
    p.add_argument("--model", help="the served translation model (default: the service's default)")
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="the PyTorch reference (default: export/checkpoints/<model>/model.safetensors)",
    )
    p.add_argument("--tokenizer", type=Path, help="default: tokenizer.json next to the checkpoint")
    p.add_argument("--batch", type=int, default=32, help="sentences per request")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads for the reference")
    p.add_argument("--timeout-s", type=float, default=600, help="per request, client side")
    p.add_argument("--tolerance", type=float, default=0.1, help="largest |service - reference| BLEU")
    p.add_argument("--documents", type=int, help="compare with the split sent as documents of N lines")
    return p.parse_args(argv)


def served_translator(client: httpx.Client, model: str | None) -> dict[str, Any]:
    """The card of translation model ``model`` (None: the default, listed first) from ``GET /v1/models``."""
    response = client.get("/v1/models")
    response.raise_for_status()
    cards = [c for c in response.json()["data"] if c["task"] == "translate" and model in (None, c["id"])]
    if not cards:
        raise RuntimeError(f"{client.base_url} serves no translation model {model or ''}")
    card: dict[str, Any] = cards[0]
    return card


def checkpoint_of(model: str) -> Path:
    """The repository's checkpoint of that name, else the default one."""
    ours = DEFAULT_CHECKPOINT.parent.parent / model / DEFAULT_CHECKPOINT.name
    return ours if ours.is_file() else DEFAULT_CHECKPOINT


def translate_batch(
    client: httpx.Client, texts: list[str], beam: int, length_penalty: float, model: str
) -> list[str]:
    body = {"text": texts, "beam_size": beam, "length_penalty": length_penalty, "model": model}
    for _ in range(RETRIES_ON_429):
        response = client.post("/v1/translate", json=body)
        if response.status_code == 429:  # the queue is full: wait as told, then again
            time.sleep(float(response.headers.get("Retry-After", "1")))
            continue
        if response.status_code != 200:
            raise RuntimeError(f"/v1/translate answered {response.status_code}: {response.text[:500]}")
        return [t["hypotheses"][0]["text"] for t in response.json()["translations"]]
    raise RuntimeError(f"/v1/translate still answered 429 after {RETRIES_ON_429} tries")


def service_translations(client: httpx.Client, sources: list[str], args: argparse.Namespace) -> list[str]:
    """Every source through the service, in order: ``--batch`` per request, ``--concurrency`` at once."""
    batches = [sources[i : i + args.batch] for i in range(0, len(sources), args.batch)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        done = pool.map(
            lambda texts: translate_batch(client, texts, args.beam, args.length_penalty, args.model), batches
        )
        return [text for batch in done for text in batch]


def document_translations(client: httpx.Client, sources: list[str], args: argparse.Namespace) -> list[str]:
    """Every source through the service as one line of a document of ``--documents`` lines."""
    documents = ["\n".join(sources[i : i + args.documents]) for i in range(0, len(sources), args.documents)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        done = pool.map(
            lambda text: translate_batch(client, [text], args.beam, args.length_penalty, args.model),
            documents,
        )
        lines = [line for (text,) in done for line in text.split("\n")]
    if len(lines) != len(sources):
        raise RuntimeError(f"{len(sources)} lines sent as documents, {len(lines)} came back")
    return lines


def pytorch_translations(sources: list[str], args: argparse.Namespace) -> list[str]:
    """``export.training.evaluate``'s translations: the checkpoint in PyTorch, same beam and penalty."""
    torch.set_num_threads(args.threads)
    model = load_checkpoint(args.checkpoint)
    tokenizer = Tokenizer.from_file(str(args.tokenizer or args.checkpoint.parent / "tokenizer.json"))
    return translate(model, tokenizer, sources, beam_size=args.beam, length_penalty=args.length_penalty)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    bleu = sacrebleu.BLEU()

    with httpx.Client(base_url=args.url, timeout=args.timeout_s) as client:
        card = served_translator(client, args.model)
        args.model = card["id"]
        args.checkpoint = args.checkpoint or checkpoint_of(args.model)
        if args.length_penalty is None:
            args.length_penalty = card.get("length_penalty") or 1.0
        pair = card["source_languages"][0], card["target_languages"][0]
        sources, references = read_parallel(args.data_dir, args.split, *pair)
        served_as = f"{card['id']} ({card['variant']}, {card['provider']}), {'→'.join(pair)}"
        print(f"service {args.url}: {served_as}", flush=True)
        start = time.perf_counter()
        served = service_translations(client, sources, args)
    service_s = time.perf_counter() - start
    service_bleu = bleu.corpus_score(served, [references]).score
    print(f"  {len(sources)} sentences in {service_s:.1f} s: BLEU {service_bleu:.2f}", flush=True)

    start = time.perf_counter()
    if args.documents:
        print(f"the same service, documents of {args.documents} lines", flush=True)
        with httpx.Client(base_url=args.url, timeout=args.timeout_s) as client:
            reference = document_translations(client, sources, args)
    else:
        print(f"PyTorch {args.checkpoint}", flush=True)
        reference = pytorch_translations(sources, args)
    reference_s = time.perf_counter() - start
    reference_bleu = bleu.corpus_score(reference, [references]).score
    print(f"  {len(sources)} sentences in {reference_s:.1f} s: BLEU {reference_bleu:.2f}", flush=True)

    difference = service_bleu - reference_bleu
    differing = sum(a != b for a, b in zip(served, reference, strict=True))
    versus = "documents" if args.documents else "PyTorch"
    print(f"difference (service - {versus}): {difference:+.2f} BLEU; {differing} translations differ")
    print(
        json.dumps(
            {
                "split": args.split,
                "beam": args.beam,
                "length_penalty": args.length_penalty,
                "model": card["id"],
                "variant": card["variant"],
                "provider": card["provider"],
                "service_bleu": round(service_bleu, 2),
                "reference": f"documents of {args.documents} lines" if args.documents else "PyTorch",
                "reference_bleu": round(reference_bleu, 2),
                "difference": round(difference, 2),
                "differing_translations": differing,
                "sentences": len(sources),
                "signature": str(bleu.get_signature()),
                "service_seconds": round(service_s, 1),
                "reference_seconds": round(reference_s, 1),
            }
        )
    )
    if abs(difference) > args.tolerance:
        print(f"FAIL: |difference| > {args.tolerance} BLEU", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
