"""The translation stage's comparison with CTranslate2: its faster configuration is the reference."""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.results import Figure, Results
from benchmarks.translation import run_suite
from benchmarks.translators import CT2_INT8, CT2_INT8_REPLICAS, Workload


class WordCodec:
    eos_id = 0

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1] * len(t.split()) + [0] for t in texts]


class Sleeper:
    """Translates by echoing, ``seconds`` a call: its throughput is known up to timer noise."""

    server_pids: Sequence[int] = ()

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    def translate(self, texts: Sequence[str], w: Workload) -> tuple[list[str], int]:
        time.sleep(self.seconds)
        return list(texts), 10 * len(texts)


def test_ours_is_compared_with_the_faster_ctranslate2_configuration() -> None:
    results = Results()
    w = Workload(4, 2, 20, True)
    systems = [
        # sleeps long beside a loaded machine's scheduling noise (the suite runs on 2 workers)
        Sleeper("HF transformers", 0.1),
        Sleeper(CT2_INT8, 0.15),  # its intra-op threads slower than its replicas, as on our box
        Sleeper(CT2_INT8_REPLICAS, 0.05),
        Sleeper("ours in-process (int8)", 0.1),
    ]
    figures = {(w, CT2_INT8): Figure.SMALL_BEAM4_BATCH32_CT2_INT8}
    run_suite(results, "t", systems, ["a b", "c", "d e f", "g"], None, WordCodec(), [(w, 4)], figures=figures)
    rows = {r.system: r for r in results.rows}
    assert results.figure(Figure.SMALL_BEAM4_BATCH32_CT2_INT8) is rows[CT2_INT8_REPLICAS]
    assert rows[CT2_INT8_REPLICAS].extra["x_ct2_int8"] == 1.0
    assert 0.3 < rows["ours in-process (int8)"].extra["x_ct2_int8"] < 0.7
    assert rows[CT2_INT8].figure is None
