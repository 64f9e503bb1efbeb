"""The measured figures: rows of comparison tables, and typed keys for the figures read back.

A row belongs to a comparison (``section``, the printed table title) and names one system. The
few rows that other code reads again (the targets and floors, cross-row ratios) are also filed
under a :class:`Figure`, so that nothing looks a row up by the words of a title; results.json
keeps the key beside each such row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Figure(StrEnum):
    """A figure the targets and floors read, whatever its section is titled in this run."""

    # translate, beam 4, batch 32: our checkpoint (natural decoding, and forced to 20 tokens),
    # the base Marian (forced 20); CTranslate2 int8 at its best (its faster configuration)
    SMALL_BEAM4_BATCH32_OURS_INT8 = "small.beam4_batch32.ours_int8"
    SMALL_BEAM4_BATCH32_CT2_INT8 = "small.beam4_batch32.ct2_int8"
    SMALL_FORCED20_OURS_INT8 = "small.beam4_batch32_forced20.ours_int8"
    SMALL_FORCED20_CT2_INT8 = "small.beam4_batch32_forced20.ct2_int8"
    BASE_BEAM4_BATCH32_OURS_INT8 = "base.beam4_batch32.ours_int8"
    BASE_BEAM4_BATCH32_CT2_INT8 = "base.beam4_batch32.ct2_int8"
    # one short sentence at a time, beam 4: p50 ms (CTranslate2 int8: its faster configuration)
    SHORT_P50_OURS_INT8 = "small.short_p50.ours_int8"
    SHORT_P50_OURS_HTTP = "small.short_p50.ours_http"
    SHORT_P50_CT2_INT8 = "small.short_p50.ct2_int8"
    # one thread each, beam 4: CTranslate2 int8's whole decode, ours whole, our graphs' runs
    # alone (tok/s)
    KERNELS_BATCH32_CT2_INT8 = "small.kernels.beam4_batch32.ct2_int8"
    KERNELS_BATCH32_OURS_WHOLE = "small.kernels.beam4_batch32.ours_whole"
    KERNELS_BATCH32_OURS_GRAPHS = "small.kernels.beam4_batch32.ours_graphs"
    KERNELS_ONE_CT2_INT8 = "small.kernels.beam4_one.ct2_int8"
    KERNELS_ONE_OURS_WHOLE = "small.kernels.beam4_one.ours_whole"
    KERNELS_ONE_OURS_GRAPHS = "small.kernels.beam4_one.ours_graphs"
    # the host side of a decode with free onnxruntime runs (stage host), beam 4: µs a
    # sentence-step at batch 128 and ms a step for one sentence, per decoder layout (the CPU's,
    # the device's), and the device layout's onnxruntime runs per decoder step
    HOST_CPU_BATCH128 = "host.translate.cpu.batch128"
    HOST_DEVICE_BATCH128 = "host.translate.device.batch128"
    HOST_CPU_ONE = "host.translate.cpu.one"
    HOST_DEVICE_ONE = "host.translate.device.one"
    HOST_DEVICE_RUNS = "host.translate.device.runs_per_step"
    # embed, sentences/s
    EMBED_SENTENCE_TRANSFORMERS = "embed.sentence_transformers"
    EMBED_OURS_FP32 = "embed.ours_fp32"
    EMBED_OURS_INT8 = "embed.ours_int8"
    EMBED_HTTP_1_CLIENT = "embed.http.1x1"
    EMBED_HTTP_64_CLIENTS = "embed.http.64x1"
    EMBED_HTTP_4_CLIENTS_32 = "embed.http.4x32"
    EMBED_INFINITY_64_CLIENTS = "embed.infinity.64x1"
    EMBED_FLOOR_64_CLIENTS = "embed.bare_handler.64x1"  # the floor of a Python HTTP path
    # the host's share with the compute replayed (stage host): in-process CPU µs a sentence,
    # over HTTP sentences/s with the server's CPU µs a sentence; on the CPU and device code paths
    HOST_EMBED_IN_PROCESS_CPU = "host.embed.in_process.cpu"
    HOST_EMBED_IN_PROCESS_DEVICE = "host.embed.in_process.device"
    HOST_EMBED_HTTP_4X128_CPU = "host.embed.http.4x128.cpu"
    HOST_EMBED_HTTP_4X128_DEVICE = "host.embed.http.4x128.device"
    HOST_EMBED_HTTP_64X1_CPU = "host.embed.http.64x1.cpu"
    HOST_EMBED_HTTP_64X1_DEVICE = "host.embed.http.64x1.device"
    HOST_EMBED_HTTP_64X1_DEVICE_2_PROCESSES = "host.embed.http.64x1.device.2_processes"  # TSERVE_WORKERS=2
    # serving efficiency
    EMBED_VS_ENGINE_HTTP = "serving.embed_vs_engine.http"
    EMBED_VS_ENGINE_IN_PROCESS = "serving.embed_vs_engine.in_process"
    EMBED_DYNAMIC = "serving.embed.dynamic"
    EMBED_SERIAL = "serving.embed.serial"
    TRANSLATE_DYNAMIC = "serving.translate.dynamic"
    TRANSLATE_SERIAL = "serving.translate.serial"
    SERVICE_RSS_AFTER_LOAD = "serving.rss_after_load"
    # the three default models in one service, peak under their load (stage memory)
    SERVICE_RSS_THREE_MODELS_PEAK = "memory.rss_three_models.peak"
    # mixed traffic: continuous vs whole-batch ("batch") decoding, and the hostile load
    MIXED_SHORT_P99_CONTINUOUS = "mixed.short_p99.continuous"
    MIXED_SHORT_P99_BATCH = "mixed.short_p99.batch"
    MIXED_TOKENS_CONTINUOUS = "mixed.tokens.continuous"
    MIXED_TOKENS_BATCH = "mixed.tokens.batch"
    UNIFORM_CONTINUOUS = "mixed.uniform.continuous"
    UNIFORM_BATCH = "mixed.uniform.batch"
    HOSTILE_ONE_WORD_P99 = "mixed.hostile.one_word_p99"
    # a dictionary term in <b> (stage markup): the plain sentences and the marked-up ones, sent/s
    MARKUP_PLAIN = "markup.plain"
    MARKUP_HTML = "markup.html"
    # terminology, terms the model never wrote: the free search, and the terms placed by alignment
    TERMS_UNSEEN_FREE = "terminology.unseen_free"
    TERMS_UNSEEN_PLACED = "terminology.unseen_placed"


@dataclass
class Row:
    """One measured figure of one system in one comparison (``section``).

    Every section has exactly one baseline row; ``ratio`` is value / baseline value, measured
    in the same run. For throughputs higher is better; for latencies lower is better.
    """

    section: str
    system: str
    value: float
    unit: str
    baseline: bool = False
    higher_is_better: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None
    figure: Figure | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)  # for plots: name → data

    def add(self, row: Row) -> Row:
        """Append (and print) ``row``; a figure key names one row of the run, never two."""
        if row.figure is not None and self.figure(row.figure) is not None:
            raise ValueError(f"figure {row.figure} measured twice")
        self.rows.append(row)
        self.fill_ratios()
        print(
            f"  [{row.section}] {row.system}: {row.value:,.1f} {row.unit}"
            + (f"  ×{row.ratio:.2f}" if row.ratio is not None else "")
            + (f"  {_short(row.extra)}" if row.extra else ""),
            flush=True,
        )
        return row

    def figure(self, key: Figure) -> Row | None:
        """The row filed under ``key``, or None when this run did not measure it."""
        return next((r for r in self.rows if r.figure is key), None)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  NOTE: {text}", flush=True)

    def fill_ratios(self) -> None:
        base = {r.section: r for r in self.rows if r.baseline}
        for r in self.rows:
            b = base.get(r.section)
            r.ratio = r.value / b.value if b is not None and b.value else None


def _short(extra: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
