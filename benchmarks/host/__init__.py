"""Stage ``host``: the host's share of a request, the models' compute made free, as on a GPU whose
compute is nearly free.

Each part (one module per task) runs the real engine, and the embedding part the service over
HTTP too, with every onnxruntime run answered at once with outputs of the right shapes, on the
CPU code path and the device one; a part that fails leaves a note and the others still run.

- ``translation.py``: µs a sentence-step at beam 4 for batches of 1 to 512, whole and continuous,
  on the CPU's decoder layout and the device's, and onnxruntime runs per decoder step
  (``free_runs.py`` makes the runs free);
- ``embedding.py``: µs a sentence in-process at batch 128, sentences/s and server CPU over HTTP
  (``replay.py`` replays each session's recorded outputs).
"""

from __future__ import annotations

from benchmarks.harness import Bench, Need, Stage
from benchmarks.host import embedding, translation

PARTS = {"translation": translation.run, "embedding": embedding.run}


def run(bench: Bench) -> None:
    for name, part in PARTS.items():
        bench.guard(f"host ({name})", part, bench)


STAGE = Stage("host", "host (compute made free)", frozenset({Need.OUR_CHECKPOINT, Need.EMBEDDING}), run)
