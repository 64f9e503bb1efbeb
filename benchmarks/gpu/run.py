"""What the stages of the GPU check share: its settings and sizes, our service on a provider, the
measured rows, the verdicts, and the results file (JSON and Markdown).

A verdict is a check the run must pass (``required``: fp16 quality within its tolerance, the CUDA
tests) or one of the issue's goals (reported with its figure; a miss says so but fails nothing).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import Service
from benchmarks.report import sections
from benchmarks.results import Results, Row
from benchmarks.server_profile import PySpy, note, top_stacks

T = TypeVar("T")
DEVICE_VARIANT = "fp16"  # what the service serves on CUDA (service/settings.py: variant auto)
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class Sizes:
    """How much each stage measures: the whole run within 7 minutes on an H100, or ``--quick``."""

    bleu_sentences: int | None  # of test_2016_flickr, per direction (None: all 1,000)
    sts_pairs: int | None  # of STS-dev (None: all 1,500)
    translate_sentences: int  # the throughput runs' sentences, length-sorted into batches
    batches: tuple[int, ...]  # sentences per batch, beam 4
    short_requests: int  # single short sentences, each timed alone
    embed_sentences: int | None  # STS-dev sentences (None: all of them)
    embed_batch: int
    embed_seconds: float  # each in-process embedding run lasts at least this long
    http_seconds: float  # each HTTP load level
    rounds: int  # runs per system, best kept (Hugging Face generate: one, each lasting seconds)
    # the embedding shape rows (benchmarks/gpu/shapes.py): a sample of STS-dev sentences, small
    # enough that one pass stays short even where new shapes are slow, and each run's least seconds
    shape_sentences: int
    shape_seconds: float


FULL = Sizes(None, None, 512, (32, 64, 128), 10, None, 128, 3.0, 4.0, 2, 512, 1.5)
QUICK = Sizes(40, 100, 12, (4, 8), 3, 192, 32, 0.3, 1.0, 1, 96, 0.2)


@dataclass
class Verdict:
    check: str
    passed: bool | None  # None: not measured (a stage failed before it)
    detail: str
    required: bool = True  # False: a goal of the issue, reported only


@dataclass
class GpuRun:
    """One run of the check: where things are, and what it found."""

    args: argparse.Namespace
    provider: str  # "cuda" or "cpu" (``--provider cpu``: the same run on the CPU)
    sizes: Sizes
    artefacts: Path  # <root>/<model>/<variant>/
    data_dir: Path  # multi30k/ and stsb/
    out: Path  # results.json, results.md, logs.txt
    work: Path  # logs and conversions
    threads: int  # cores for the CPU-side systems (services on CPU, tokenizers)
    results: Results = field(default_factory=Results)
    verdicts: list[Verdict] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    log_files: dict[str, Path] = field(default_factory=dict)  # name → log, their tails in logs.txt

    @property
    def device_label(self) -> str:
        return f"{DEVICE_VARIANT}, {'CUDA' if self.provider == 'cuda' else 'CPU'}"

    def verdict(self, check: str, passed: bool | None, detail: str, required: bool = True) -> None:
        self.verdicts.append(Verdict(check, passed, detail, required))
        mark = {True: "PASS", False: "FAIL" if required else "MISSED", None: "NOT MEASURED"}[passed]
        print(f"  [{mark}] {check}: {detail}", flush=True)

    def guard(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """fn(*args), timed; an exception becomes a failed verdict and the run goes on. The results
        so far are written after every stage: a run cut short (the device call's time limit) still
        leaves them."""
        t0 = time.perf_counter()
        print(f"== {what}", flush=True)
        try:
            return fn(*args)
        except Exception as e:
            traceback.print_exc()
            self.verdict(what, False, f"{type(e).__name__}: {str(e)[:500]}")
            return None
        finally:
            self.stage_seconds[what] = time.perf_counter() - t0
            write(self)

    def device_settings(self) -> dict[str, str]:
        """The device service's TSERVE_* settings beyond the provider: batches up to the largest
        measured."""
        return {
            "TSERVE_MAX_BATCH_SIZE": str(max(*self.sizes.batches, self.sizes.embed_batch)),
            "TSERVE_MAX_BATCH_TOKENS": "16384",
        }

    def record_profile(self, what: str, spy: PySpy) -> None:
        """A py-spy recording's summary as a note, its heaviest stacks into logs.txt (the raw
        file stays where it was written, in ``out``), or a note saying why there is none."""
        if spy.profile is None:
            self.results.note(f"{what}: not profiled: {spy.why_not}")
            return
        self.results.note(note(what, spy.profile))
        stacks = self.work / f"{spy.raw.stem}.stacks.txt"
        stacks.write_text(top_stacks(spy.profile, LOG_TAIL_CHARS))
        self.log_files[f"{spy.raw.name}, heaviest stacks ({what})"] = stacks

    def service(
        self, variant: str, provider: str, tag: str, models: Sequence[str], embed_model: str, **env: str
    ) -> Service:
        """``python -m service`` on ``provider`` serving ``variant`` of the models named; ``env``
        further TSERVE_* settings. Its log's tail goes into logs.txt."""
        log = self.log_files[f"service {tag}"] = self.work / f"service-{tag}.log"
        settings = {
            "TSERVE_PROVIDER": provider,
            "TSERVE_MAX_ITEMS_PER_REQUEST": str(max((*self.sizes.batches, self.sizes.embed_batch, 64))),
            **env,
        }
        return Service(
            self.artefacts,
            models,
            embed_model,
            variant=variant,
            threads=self.threads,
            log=log,
            extra_env=settings,
            ready_timeout_s=300,
        )


def write(run: GpuRun) -> dict[str, Path]:
    """results.json, results.md and logs.txt in ``run.out``."""
    run.out.mkdir(parents=True, exist_ok=True)
    run.results.fill_ratios()
    run.meta["stage_seconds"] = {k: round(v, 1) for k, v in run.stage_seconds.items()}
    paths = {name: run.out / name for name in ("results.json", "results.md", "logs.txt")}
    body = {
        "meta": run.meta,
        "verdicts": [asdict(v) for v in run.verdicts],
        "rows": [r.to_dict() for r in run.results.rows],
        "notes": run.results.notes,
        "series": run.results.series,
    }
    paths["results.json"].write_text(json.dumps(body, indent=1, default=str) + "\n")
    paths["results.md"].write_text(markdown(run))
    paths["logs.txt"].write_text("".join(f"===== {k}: {p}\n{_tail(p)}\n" for k, p in run.log_files.items()))
    return paths


def failed(run: GpuRun) -> list[Verdict]:
    return [v for v in run.verdicts if v.required and v.passed is not True]


def markdown(run: GpuRun) -> str:
    m = run.meta
    lines = [
        f"# GPU check ({run.device_label}{', quick' if run.args.quick else ''})",
        "",
        f"- command: `{m.get('command', '')}`, started {m.get('started', '')}, "
        f"{sum(run.stage_seconds.values()):.0f} s",
        f"- device: {m.get('gpu', 'none')}; onnxruntime {m.get('onnxruntime', '?')} "
        f"({m.get('cuda_session', '?')}); torch {m.get('torch', '?')}",
        f"- host: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; Python {m.get('python', '?')}",
        f"- stages (s): {', '.join(f'{k} {v:.0f}' for k, v in run.stage_seconds.items())}",
        "",
        f"**{'FAILED' if failed(run) else 'PASSED'}**: {len(failed(run))} required check(s) failed.",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for v in run.verdicts:
        mark = {True: "pass", False: "**FAIL**" if v.required else "missed", None: "not measured"}[v.passed]
        lines.append(f"| {v.check}{'' if v.required else ' (goal)'} | {mark} | {v.detail} |")
    lines.append("")
    for name, rows in sections(run.results.rows).items():
        lines += _table(name, sorted(rows, key=lambda r: not r.baseline))
    if run.results.notes:
        lines += ["### Notes", "", *(f"- {n}" for n in run.results.notes), ""]
    return "\n".join(lines)


def _table(name: str, rows: Sequence[Row]) -> list[str]:
    keys = sorted({k for r in rows for k in r.extra})
    has_base = any(r.baseline for r in rows)
    head = ["system", "value", *(["× baseline"] if has_base else []), *keys]
    out = [f"### {name}", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [f"**{r.system}**" if r.baseline else r.system, f"{_fmt(r.value)} {r.unit}"]
        if has_base:
            cells.append(f"{r.ratio:.2f}" if r.ratio is not None else "–")
        cells += [_fmt(r.extra[k]) if k in r.extra else "" for k in keys]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as e:
        return f"(unreadable: {e})"
