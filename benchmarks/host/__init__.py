"""Stage ``host``: what the host side of our engines costs when onnxruntime's runs are free, as
on a GPU whose compute is nearly free: the real engines and decoders, every session's run
answered at once with outputs of the right shapes (``free_runs.py``).

Translation (``translation.py``): µs a sentence-step at beam 4 for batches of 1 to 512, whole and
continuous, on the CPU's decoder layout and the device's, and onnxruntime runs per decoder step.
"""

from __future__ import annotations

from benchmarks.harness import Bench, Need, Stage
from benchmarks.host import translation


def run(bench: Bench) -> None:
    bench.guard("host: translation", translation.run, bench)


STAGE = Stage("host", "host side with free onnxruntime runs", frozenset({Need.OUR_CHECKPOINT}), run)
