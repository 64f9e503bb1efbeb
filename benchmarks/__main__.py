"""``python -m benchmarks``: our engine and service side by side with the tools users would pick.

    python -m benchmarks --quick --data-dir path/to/data     # a few minutes
    python -m benchmarks --data-dir path/to/data --out benchmarks/results

Translation (identical weights everywhere): Hugging Face generate (baseline), CTranslate2 fp32 and
int8, our engine in-process (fp32, int8) and our service over HTTP, on our checkpoint mapped onto
a MarianMTModel, and on a base-sized random-weight Marian with outputs forced to 20 tokens.
Embeddings: sentence-transformers in-process (baseline), our engine in-process (fp32, int8), our
service and Infinity (optional, its own venv) over HTTP. Serving: dynamic batching vs batch size
1, HTTP vs in-process, RSS, server CPU per request. The stages are listed in
``benchmarks/stages.py``. Writes results.json, results.md and PNG plots to ``--out``;
converted and exported models are cached under ``--out/cache``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.common import REPO, machine, other_load, versions
from benchmarks.harness import Bench, Need, needs_of
from benchmarks.preparation import prepare
from benchmarks.stages import STAGES
from benchmarks.targets import check_targets

DEFAULT_CHECKPOINT = REPO / "export" / "checkpoints" / "transformer-en-de" / "model.safetensors"
PACKAGES = [
    "onnxruntime",
    "torch",
    "transformers",
    "ctranslate2",
    "sentence-transformers",
    "tokenizers",
    "numpy",
    "httpx",
    "uvicorn",
    "fastapi",
]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small inputs and short load runs (a few minutes)")
    p.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="holds multi30k/ (test_2016_flickr.{en,de}) and stsb/sts-dev.csv",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help="our translation checkpoint (tokenizer.json beside it)",
    )
    p.add_argument(
        "--embed-model", type=Path, help="sentence-transformers dir (default: the MiniLM package's)"
    )
    p.add_argument("--threads", type=int, default=2, help="compute threads of every system")
    p.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], help="run only these stages")
    p.add_argument("--no-http", action="store_true", help="skip everything that needs our service")
    p.add_argument(
        "--infinity-venv",
        type=Path,
        help="venv with infinity-emb (default: benchmarks/.venv-infinity, "
        "/tmp/venv-infinity); skipped when none is found",
    )
    p.add_argument("--no-infinity", action="store_true")
    p.add_argument(
        "--rounds",
        type=int,
        help="runs per system, in-process and over HTTP, in turn; best kept (default 2 quick, 3)",
    )
    p.add_argument("--duration", type=float, help="seconds per HTTP load level (default 6 quick, 30 full)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    bench = Bench(args)
    meta: dict[str, Any] = {
        "load_before": other_load(),
        "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "threads": args.threads,
        "checkpoint": str(args.checkpoint),
        "machine": machine(),
        "versions": versions(PACKAGES),
        "niceness": os.nice(0),
    }
    stages = [s for s in STAGES if args.only is None or s.name in args.only]
    if Need.OUR_CHECKPOINT in needs_of(stages) and not args.checkpoint.is_file():
        sys.exit(f"no checkpoint at {args.checkpoint}: pass --checkpoint (tokenizer.json must sit beside it)")
    try:
        prepare(bench, needs_of(stages))
        bench.run(stages)
        bench.guard("targets", check_targets, bench.results)
    finally:
        meta["seconds"] = time.perf_counter() - t0
        meta["stage_seconds"] = bench.stage_seconds
        meta["load_average_end"] = os.getloadavg()
        paths = report.write(bench.results, meta, args.out)
        print(report.markdown(bench.results, meta))
        print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
