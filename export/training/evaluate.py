"""sacreBLEU of a PyTorch checkpoint on a parallel test set (the figure in the model card).

python -m export.training.evaluate --data-dir path/to/data/multi30k --split test_2016_flickr --beam 4

With several ``--checkpoint``s (one vocabulary), their ensemble's score (export/sources/ours/translate.py).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import sacrebleu
from tokenizers import Tokenizer

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import read_parallel
from export.sources.ours.translate import DEFAULT_CHECKPOINT, checkpoint_length_penalty, translate


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m export.training.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint", type=Path, nargs="+", default=[DEFAULT_CHECKPOINT], help="several: their ensemble"
    )
    p.add_argument("--tokenizer", type=Path, help="default: tokenizer.json next to the checkpoint")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument(
        "--length-penalty",
        type=float,
        help="score = log-prob / length ** penalty "
        "(default: the checkpoint's generation_config.json, else 1.0)",
    )
    p.add_argument("--device", default="cpu", help="where the checkpoints decode")
    args = p.parse_args(argv)

    models = [load_checkpoint(c, args.device) for c in args.checkpoint]
    first = args.checkpoint[0]
    tokenizer = Tokenizer.from_file(str(args.tokenizer or first.parent / "tokenizer.json"))
    sources, references = read_parallel(args.data_dir, args.split, args.src_lang, args.tgt_lang)
    start = time.time()
    penalty = checkpoint_length_penalty(first, args.length_penalty)
    hyps = translate(models, tokenizer, sources, beam_size=args.beam, length_penalty=penalty)
    bleu = sacrebleu.BLEU()
    score = bleu.corpus_score(hyps, [references])
    print(
        json.dumps(
            {
                "checkpoints": [str(c) for c in args.checkpoint],
                "split": args.split,
                "beam": args.beam,
                "length_penalty": penalty,
                "bleu": round(score.score, 2),
                "signature": str(bleu.get_signature()),
                "seconds": round(time.time() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
