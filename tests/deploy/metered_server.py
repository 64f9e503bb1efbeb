"""``python tests/deploy/metered_server.py [--delay-s S]``: tests/service/run_small_server.py's
server — the real entry point ``service.__main__.serve`` over the small NumPy engines — with the
engine-level metrics the ONNX engines record (service/engine/embedder.py, translator.py):
tokenize/encoder/pool/decoder/detokenize stage times and the input/output token counters, and
those of continuous decoding (service/queue/continuous.py, which drives only the ONNX translator):
running sentences, free rows, step time, sentences admitted per step.

The small engines model the engines' results, not their instrumentation; without this, the
token panels of the dashboard would have nothing to show in tests/deploy/test_prometheus_live.py.
Settings come from ``TSERVE_*`` as for ``python -m service``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.engine.base import Embedding, EmbedItem, TranslateItem, Translation
from service.metrics import (
    ADMITTED_PER_STEP,
    DECODE_FREE_ROWS,
    DECODE_RUNNING,
    DECODE_STEP,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    observe_stage,
)
from tests.service import run_small_server
from tests.service.small_engines import HashEmbedder, ReverseTranslator


class MeteredEmbedder(HashEmbedder):
    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        name = self.manifest.name
        start = time.perf_counter()
        observe_stage(name, "tokenize", 0.0)
        out = super().embed(items)
        INPUT_TOKENS.labels(model=name).inc(sum(r.n_tokens for r in out if not isinstance(r, Exception)))
        elapsed = time.perf_counter() - start
        observe_stage(name, "encoder", elapsed * 0.9)
        observe_stage(name, "pool", elapsed * 0.1)
        return out


class MeteredTranslator(ReverseTranslator):
    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        name = self.manifest.name
        start = time.perf_counter()
        observe_stage(name, "tokenize", 0.0)
        out = super().translate(items)
        done = [r for r in out if isinstance(r, Translation)]
        INPUT_TOKENS.labels(model=name).inc(sum(r.n_input_tokens for r in done))
        elapsed = time.perf_counter() - start
        observe_stage(name, "encoder", elapsed * 0.2)
        observe_stage(name, "decoder", elapsed * 0.8)
        observe_stage(name, "detokenize", 0.0)
        OUTPUT_TOKENS.labels(model=name).inc(sum(r.n_output_tokens for r in done))
        steps = max((r.n_output_tokens for r in done), default=0) + 1
        ADMITTED_PER_STEP.labels(model=name).observe(len(items))
        DECODE_RUNNING.labels(model=name).set(0)
        DECODE_FREE_ROWS.labels(model=name).set(512)
        for _ in range(steps):
            DECODE_STEP.labels(model=name).observe(elapsed * 0.8 / steps)
        return out


def main(argv: list[str] | None = None) -> int:
    return run_small_server.main(argv, MeteredEmbedder, MeteredTranslator)


if __name__ == "__main__":
    sys.exit(main())
