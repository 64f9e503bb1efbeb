"""Our engines in-process as the service loads them on a provider, for the GPU check's speed
stage: the translator called directly on whole batches or continuously, the embedder in calls of a
batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.timed_pass import natural_max_len
from benchmarks.translators import TextCodec, Workload
from service.engine.session import SessionConfig

ENGINE_THREADS = 4  # onnxruntime intra-op threads of our in-process engines
BEAM = 4  # the speed stage's translations and the goals


class OursOnDevice:
    """Our ``OnnxTranslator`` as the service loads it on ``provider`` (fp16 on CUDA keeps memory,
    cache and top-k on the device), called directly."""

    server_pids: Sequence[int] = ()

    def __init__(self, artefact_dir: Path, provider: str, name: str) -> None:
        from service.engine.translation.translator import OnnxTranslator

        self.name = name
        self.engine = OnnxTranslator(artefact_dir, SessionConfig(provider, ENGINE_THREADS))
        self.engine.warmup()

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        """Whole batches: ``texts`` decoded together to the last one's end."""
        from service.engine.base import TranslateItem, TranslateOptions

        self.engine.max_decode_rows = max(len(texts) * w.beam, 1)
        options = TranslateOptions(beam_size=w.beam, max_length=w.max_len)
        return self._done(self.engine.translate([TranslateItem(t, options) for t in texts]))

    def continuous(self, texts: Sequence[str], batch: int, codec: TextCodec) -> tuple[float, list[str]]:
        """(target tokens/s, outputs): every sentence in one call, at most ``batch`` decoding at once."""
        from service.engine.base import TranslateItem, TranslateOptions

        self.engine.max_decode_rows = batch * BEAM
        items = [
            TranslateItem(t, TranslateOptions(beam_size=BEAM, max_length=natural_max_len([t], codec)))
            for t in texts
        ]
        start = time.perf_counter()
        outputs, tokens = self._done(self.engine.translate(items))
        return tokens / (time.perf_counter() - start), outputs

    @staticmethod
    def _done(results: Sequence[Any]) -> tuple[list[str], int]:
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        return [r.hypotheses[0].text for r in results], sum(r.n_output_tokens for r in results)


class EmbedOnDevice:
    """Our embedding engine as the service loads it on ``provider``, in calls of ``batch`` sentences."""

    def __init__(self, artefact_dir: Path, provider: str, batch: int, name: str) -> None:
        from service.engine.loader import load_engine

        self.name, self.config, self.batch = name, f"batch {batch}", batch
        session = SessionConfig(provider, ENGINE_THREADS)
        self.engine: Any = load_engine(
            artefact_dir, session, max_batch_size=batch, max_batch_tokens=batch * 128
        )
        self.engine.warmup()

    def embed(self, sentences: Sequence[str]) -> None:
        from service.engine.base import EmbedItem

        for i in range(0, len(sentences), self.batch):
            out = self.engine.embed([EmbedItem(s) for s in sentences[i : i + self.batch]])
            errors = [r for r in out if isinstance(r, Exception)]
            if errors:
                raise errors[0]
