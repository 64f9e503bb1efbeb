"""Results as JSON, a markdown table per comparison, and PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results import Results, Row

CONTENDED_PCT = 15.0  # machine busy before the run above this: the report says so

_EXTRA_ORDER = (
    "target",
    "met",
    "bounds",
    "bleu",
    "p50_ms",
    "p99_ms",
    "x_ct2_int8",
    "x_infinity",
    "server_cores_busy",
    "server_cpu_ms_per_request",
    "machine_busy_pct",
    "seconds",
    "requests",
    "errors",
)
_EXTRA_LABEL = {
    "target": "target",
    "met": "met",
    "bounds": "the target it bounds",
    "bleu": "BLEU",
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
    "x_ct2_int8": "× CT2 int8",
    "x_infinity": "× Infinity",
    "cores_used": "cores used",
    "server_cores_busy": "server cores",
    "server_cpu_ms_per_request": "server CPU ms/req",
    "machine_busy_pct": "machine busy %",
    "seconds": "s",
    "requests": "requests",
    "errors": "errors",
}


def _value(v: float) -> str:
    """A row's value; NaN: the run has none (a target's or a floor's figure it did not measure,
    a percentile of no successful request)."""
    return "not measured" if math.isnan(v) else _fmt(v)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def sections(rows: Sequence[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r.section, []).append(r)
    return out


def markdown(results: Results, meta: dict[str, Any]) -> str:
    m = meta.get("machine", {})
    before = meta.get("load_before", {})
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in meta.get("stage_seconds", {}).items())
    lines = [
        "# Benchmark results",
        "",
        f"- command: `{meta.get('command', '')}`",
        f"- when: {meta.get('started', '')} ({meta.get('seconds', 0):.0f} s: {stages})",
        f"- machine: {m.get('cpu', '?')}, {m.get('logical_cores', '?')} logical cores"
        f"{' (AVX-512 VNNI)' if m.get('avx512_vnni') else ''}, {m.get('memory_gb', '?')} GB; "
        f"load average at start {tuple(round(x, 2) for x in m.get('load_average', ()))}",
        f"- threads per system: {meta.get('threads')} (our service: that many cores, divided among its "
        "concurrent runs); the HTTP load generator runs on the same cores as the server under test "
        "(identical for every HTTP system)",
        f"- mode: {'quick' if meta.get('quick') else 'full'}",
    ]
    if before.get("busy_pct", 0) > CONTENDED_PCT:
        lines.append(
            f"- **contended run**: before it started the machine was {before['busy_pct']:.0f} % busy "
            f"({'; '.join(before.get('busiest', [])) or 'no single process'}), niceness "
            f"{meta.get('niceness')}: absolute figures are depressed and noisy; the ratios within a "
            "section were measured in the same run"
        )
    lines += [
        "",
        "Ratios (×) are to the section's baseline (**bold**), measured in the same run. Throughputs: higher "
        "is better; latencies (ms): lower is better. BLEU: sacreBLEU of each system's own outputs on "
        "the section's first sentences of Multi30k test_2016_flickr.",
        "",
    ]
    for name, rows in sections(results.rows).items():
        rows = sorted(rows, key=lambda r: not r.baseline)  # baseline first, otherwise as measured
        keys = [k for k in _EXTRA_ORDER if any(k in r.extra for r in rows)]
        keys += sorted({k for r in rows for k in r.extra} - set(keys))
        keys = [k for k in keys if k not in ("seconds", "requests")]
        has_base = any(r.baseline for r in rows)
        one_unit = len({r.unit for r in rows}) == 1
        head = (
            ["system", rows[0].unit if one_unit else "value"]
            + (["× baseline"] if has_base else [])
            + [_EXTRA_LABEL.get(k, k) for k in keys]
        )
        lines += [f"### {name}", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for r in rows:
            value = _value(r.value) if one_unit or math.isnan(r.value) else f"{_fmt(r.value)} {r.unit}"
            cells = [f"**{r.system}**" if r.baseline else r.system, value]
            if has_base:
                cells.append(f"{r.ratio:.2f}" if r.ratio is not None else "–")
            cells += [_fmt(r.extra[k]) if k in r.extra else "" for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if results.notes:
        lines += ["### Notes", ""] + [f"- {n}" for n in results.notes] + [""]
    return "\n".join(lines)


def write(results: Results, meta: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    results.fill_ratios()
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
    paths["json"].write_text(
        json.dumps(
            {
                "meta": meta,
                "rows": [r.to_dict() for r in results.rows],
                "notes": results.notes,
                "series": results.series,
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    paths["markdown"].write_text(markdown(results, meta))
    try:
        paths.update(plots(results, out_dir))
    except Exception as e:  # plots are a convenience; the numbers are in the JSON
        results.note(f"plots failed: {type(e).__name__}: {e}")
    return paths


def plots(results: Results, out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, Path] = {}

    curves: dict[str, dict[str, dict[str, float]]] = results.series.get("embed_concurrency", {})
    if curves:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for system, points in curves.items():
            xs = sorted(int(c) for c in points)
            ax[0].plot(xs, [points[str(x)]["items_per_s"] for x in xs], marker="o", label=system)
            ax[1].plot(xs, [points[str(x)]["p99_ms"] for x in xs], marker="o", label=f"{system}")
        for a, title in zip(ax, ("throughput (sentences/s)", "p99 latency (ms)"), strict=True):
            a.set_xscale("log", base=2)
            a.set_xlabel("concurrent clients (1 sentence / request)")
            a.set_title(title)
            a.grid(alpha=0.3)
        ax[1].set_yscale("log")
        ax[0].legend(fontsize=8)
        fig.tight_layout()
        out["plot_concurrency"] = out_dir / "embed_concurrency.png"
        fig.savefig(out["plot_concurrency"], dpi=110)
        plt.close(fig)

    lat_rows = [r for r in results.rows if "p50_ms" in r.extra and "p99_ms" in r.extra]
    lat_rows += [r for r in results.rows if r.unit == "ms p50" and r not in lat_rows]
    if lat_rows:
        labels = [f"{r.section.split(':')[0]} | {r.system}" for r in lat_rows]
        p50 = [r.extra.get("p50_ms", r.value) for r in lat_rows]
        p99 = [r.extra.get("p99_ms", float("nan")) for r in lat_rows]
        fig, ax = plt.subplots(figsize=(10, 0.32 * len(lat_rows) + 1.5))
        ys = range(len(lat_rows))
        ax.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99")
        ax.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50")
        ax.set_yticks(list(ys), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale)")
        ax.invert_yaxis()
        ax.legend()
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        out["plot_latency"] = out_dir / "latency_percentiles.png"
        fig.savefig(out["plot_latency"], dpi=110)
        plt.close(fig)

    tr = {k: v for k, v in sections(results.rows).items() if v[0].unit == "tok/s"}
    if tr:
        systems = list(dict.fromkeys(r.system for rows in tr.values() for r in rows))
        fig, ax = plt.subplots(figsize=(12, 0.5 * len(tr) + 2.5))
        width = 0.8 / max(len(systems), 1)
        for j, system in enumerate(systems):
            vals = [next((r.value for r in rows if r.system == system), 0.0) for rows in tr.values()]
            ax.barh([i + j * width for i in range(len(tr))], vals, height=width, label=system)
        ax.set_yticks(
            [i + 0.4 - width / 2 for i in range(len(tr))],
            [k.removeprefix("translate ") for k in tr],
            fontsize=7,
        )
        ax.invert_yaxis()
        ax.set_xlabel("target tokens/s")
        ax.legend(fontsize=7)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        out["plot_translation"] = out_dir / "translation_throughput.png"
        fig.savefig(out["plot_translation"], dpi=110)
        plt.close(fig)
    return out
