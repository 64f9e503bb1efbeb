"""``python -m benchmarks.profile``: a steady workload on our engine, to profile its hot paths.

    py-spy record -o translate.svg -- python -m benchmarks.profile translate
    python -m benchmarks.profile translate --ops     # onnxruntime's time per operator type instead
    python -m benchmarks.profile embed

translate: our translation artefact exported by a harness run (``<out>/cache/artefacts``), beam 4,
batches of 32 length-sorted test_2016_flickr sentences; embed: the MiniLM artefact, 32-sentence
calls over STS-dev sentences. Prints the throughput of each round.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import sts_sentences
from service.engine.session import SessionConfig


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", choices=("translate", "embed"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="the harness's --out")
    p.add_argument("--artefact", type=Path, help="artefact directory (default: the harness's cached one)")
    p.add_argument("--data-dir", type=Path, required=True, help="as for python -m benchmarks")
    p.add_argument("--variant", default="int8")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ops", action="store_true", help="print onnxruntime's per-operator profile")
    return p.parse_args(argv)


def enable_ort_profiling(prefix: Path) -> None:
    """Every session the engine creates from now on writes onnxruntime's profile."""
    from service.engine import session

    plain = session.session_options

    def profiled(*args: Any, **kwargs: Any) -> Any:
        so = plain(*args, **kwargs)
        so.enable_profiling = True
        so.profile_file_prefix = str(prefix)
        return so

    session.session_options = profiled


def op_shares(profile_json: str) -> list[tuple[str, float]]:
    """(operator type, share of kernel time), largest first."""
    by_op: collections.Counter[str] = collections.Counter()
    for e in json.loads(Path(profile_json).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    total = sum(by_op.values()) or 1
    return [(op, d / total) for op, d in by_op.most_common()]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.ops:
        enable_ort_profiling(Path("/tmp") / f"benchmarks-profile-{args.task}")
    from service.engine.base import EmbedItem, TranslateItem, TranslateOptions
    from service.engine.loader import load_engine

    name = "transformer-en-de" if args.task == "translate" else "all-MiniLM-L6-v2"
    artefact = args.artefact or args.out / "cache" / "artefacts" / name / args.variant
    engine: Any = load_engine(artefact, SessionConfig("cpu", args.threads))
    engine.warmup()
    if args.task == "translate":
        path = args.data_dir / "multi30k" / "test_2016_flickr.en.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts = sorted((line.rstrip("\n") for line in f), key=len)[: args.sentences]
        options = TranslateOptions(beam_size=args.beam, max_length=256)
    else:
        texts = sts_sentences(args.data_dir)[: args.sentences]
    for r in range(args.rounds):
        t0, units = time.perf_counter(), 0
        for i in range(0, len(texts), args.batch):
            chunk = texts[i : i + args.batch]
            if args.task == "translate":
                units += sum(
                    t.n_output_tokens for t in engine.translate([TranslateItem(x, options) for x in chunk])
                )
            else:
                engine.embed([EmbedItem(x) for x in chunk])
                units += len(chunk)
        unit = "target tok/s" if args.task == "translate" else "sentences/s"
        print(f"round {r}: {units / (time.perf_counter() - t0):,.1f} {unit}", flush=True)
    if args.ops:
        sessions = (
            {"encoder": engine.backend.encoder, "decoder": engine.backend.decoder}
            if args.task == "translate"
            else {"encoder": engine.session}
        )
        for graph, session in sessions.items():
            print(f"{graph}: share of onnxruntime kernel time")
            for op, share in op_shares(session.end_profiling())[:10]:
                print(f"  {100 * share:5.1f} %  {op}")


if __name__ == "__main__":
    main()
