"""Sequence-level knowledge distillation data (Kim & Rush, 2016): the training corpus with its
targets replaced by a teacher's translations, a data directory for ``python -m export.training.train``.

    python -m export.training.distill --teacher export/checkpoints/transformer-en-de/model.safetensors \\
        --teacher runs/en-de-rdrop/averaged.safetensors --data-dir path/to/data/multi30k \\
        --out runs/kd-data

The teacher is one checkpoint or, with several, their ensemble (export/sources/ours/translate.py), decoding
with beam 4 and the first teacher's length penalty. ``train.{src}.gz`` is the corpus's own
source side, ``train.{tgt}.gz`` the teacher's output, line for line; ``val.*`` are copied as
they are, so training still selects on the real references. A student trained on it learns the
teacher's (simpler, more consistent) outputs and keeps one model's decoding cost.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import read_parallel, split_file
from export.sources.ours.translate import checkpoint_length_penalty, translate

CHUNK = 2048  # sentences translated between two progress lines


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m export.training.distill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--teacher", type=Path, action="append", required=True, help="repeat for an ensemble")
    p.add_argument("--tokenizer", type=Path, help="default: tokenizer.json next to the first teacher")
    p.add_argument("--data-dir", type=Path, required=True, help="holds train.{src,tgt}[.gz], val.*")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--length-penalty", type=float, help="default: the first teacher's generation config")
    p.add_argument("--device", default="cpu", help="where the teachers decode (cuda on a GPU host)")
    return p.parse_args(argv)


def write_lines(path: Path, lines: Sequence[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(f"{line}\n" for line in lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    teachers = [load_checkpoint(t, args.device) for t in args.teacher]
    tokenizer = Tokenizer.from_file(str(args.tokenizer or args.teacher[0].parent / "tokenizer.json"))
    penalty = checkpoint_length_penalty(args.teacher[0], args.length_penalty)
    sources, _ = read_parallel(args.data_dir, "train", args.src_lang, args.tgt_lang)
    start, outputs = time.time(), []
    for i in range(0, len(sources), CHUNK):
        chunk = sources[i : i + CHUNK]
        outputs += translate(teachers, tokenizer, chunk, beam_size=args.beam, length_penalty=penalty)
        print(f"{len(outputs)}/{len(sources)} sentences, {time.time() - start:.0f} s", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    write_lines(args.out / f"train.{args.src_lang}.gz", sources)
    write_lines(args.out / f"train.{args.tgt_lang}.gz", outputs)
    for lang in (args.src_lang, args.tgt_lang):
        val = split_file(args.data_dir, "val", lang)
        shutil.copyfile(val, args.out / val.name)


if __name__ == "__main__":
    main()
