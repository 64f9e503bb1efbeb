"""Stage ``host``: the host's share of a request, the models' compute made free.

Each part (one module per task) measures its engine in-process and the service over HTTP with
every onnxruntime session replayed (``replay.py``), on the CPU code path and the device one; a
part that fails leaves a note and the others still run.
"""

from __future__ import annotations

from benchmarks.harness import Bench, Need, Stage
from benchmarks.host import embedding

PARTS = {"embedding": embedding.run}


def run(bench: Bench) -> None:
    for name, part in PARTS.items():
        bench.guard(f"host ({name})", part, bench)


STAGE = Stage("host", "host (compute replayed)", frozenset({Need.EMBEDDING}), run)
