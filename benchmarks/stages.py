"""The stages of ``python -m benchmarks``, in the order they run; ``--only`` picks among them.

A new stage is one module with ``run(bench)`` and ``STAGE = Stage(name, label, needs, run)``
(see ``harness.py``) and one line here.
"""

from __future__ import annotations

from benchmarks import (
    base_marian,
    detection,
    embedding,
    files,
    host,
    markup,
    memory,
    mixed_traffic,
    nllb,
    serving,
    terminology,
    translation,
)
from benchmarks.harness import Stage

STAGES: tuple[Stage, ...] = (
    translation.STAGE,
    base_marian.STAGE,
    nllb.STAGE,
    terminology.STAGE,
    markup.STAGE,
    embedding.STAGE,
    host.STAGE,
    detection.STAGE,  # before serving, which stops the shared service
    files.STAGE,
    serving.STAGE,
    mixed_traffic.STAGE,
    memory.STAGE,
)
