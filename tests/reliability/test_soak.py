"""Soak: ``python -m service`` on the tiny real ONNX models (tests/tiny_models.py), under a mixed
translate/embed load of mixed lengths and options, for a fixed time. Every request must succeed,
and the server's resident memory at the end may exceed its level after warm-up by under 5 %.

The warm-up runs the same mix, so onnxruntime's arenas and the allocator have met the largest
shapes before the baseline is taken; growth after that is a leak (of requests, batches, futures,
metrics series, sessions' per-call state), not first use.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tests.reliability.load import Outcome, Request, run_load, statuses
from tests.servers import ServerProcess, artefact_env, server_process, service_command
from tests.tiny_models import WORDS

CONNECTIONS = 4
MAX_GROWTH = 0.05


def mixed(i: int) -> Request:
    """Request ``i`` of the mix: seeded by ``i``, so a failure can be replayed."""
    rng = random.Random(i)

    def text(max_words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))

    kind = rng.random()
    if kind < 0.4:
        beam = rng.randint(1, 4)
        return "/v1/translate", {
            "text": [text(10) for _ in range(rng.randint(1, 4))],
            "beam_size": beam,
            "n_best": rng.randint(1, beam),
            "max_length": rng.choice([8, 32, 40]),  # the tiny model writes at most 40
        }
    if kind < 0.8:  # texts past the tiny BERT's 16 tokens are truncated
        return "/v1/embed", {"texts": [text(40) for _ in range(rng.randint(1, 16))]}
    return "/v1/embeddings", {"input": text(40), "encoding_format": rng.choice(["float", "base64"])}


def _load_for(server: ServerProcess, seconds: float, first: int) -> list[Outcome]:
    end = time.monotonic() + seconds
    return asyncio.run(
        run_load(
            server.url,
            lambda i: mixed(first + i),
            n=10**9,
            connections=CONNECTIONS,
            stop=lambda: time.monotonic() >= end,
        )
    )


# The translation cache grows to its bound by design: a bound the warm-up fills, so that what
# grows after it is a leak, the cache's own bound included.
CACHE_BYTES = 1 << 20


def soak(artefact_root: Path, tmp_path: Path, warmup_s: float, soak_s: float) -> None:
    env = {**artefact_env(artefact_root), "TSERVE_TRANSLATION_CACHE_BYTES": str(CACHE_BYTES)}
    with server_process(service_command(), env, tmp_path / "server.log") as server:
        warm = _load_for(server, warmup_s, first=0)
        assert statuses(warm) == {200: len(warm)}, statuses(warm)
        baseline = server.rss_bytes()
        outcomes: list[Outcome] = []
        peak = baseline
        start = time.monotonic()
        while (left := start + soak_s - time.monotonic()) > 0:  # RSS sampled every ~10 s
            outcomes += _load_for(server, min(10.0, left), first=len(warm) + len(outcomes))
            peak = max(peak, server.rss_bytes())
        end = server.rss_bytes()
        growth = end / baseline - 1
        failed = [o for o in outcomes if o.status != 200]
        print(
            f"soak: {len(outcomes)} requests in {soak_s:.0f} s after {len(warm)} in a {warmup_s:.0f} s "
            f"warm-up; RSS {baseline / 2**20:.1f} MiB after warm-up, {end / 2**20:.1f} MiB at the end "
            f"({growth:+.2%}), peak {peak / 2**20:.1f} MiB; {dict(statuses(outcomes))}"
        )
        assert not failed, [(o.status, o.error, o.body[:200]) for o in failed[:5]]
        assert len(outcomes) >= soak_s, "the soak hardly ran"
        assert growth < MAX_GROWTH, f"RSS grew by {growth:.2%}"
        assert "Traceback" not in server.log()
        assert 0 < server.metric("tserve_translation_cache_bytes") <= CACHE_BYTES


def test_soak(artefact_root: Path, tmp_path: Path) -> None:
    soak(artefact_root, tmp_path, warmup_s=10, soak_s=20)  # the long test soaks for 10 minutes


@pytest.mark.long
def test_soak_ten_minutes(artefact_root: Path, tmp_path: Path) -> None:
    soak(artefact_root, tmp_path, warmup_s=60, soak_s=600)
