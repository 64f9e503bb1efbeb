"""``python -m export.graphs.vmap --tokenizer tokenizer.json --source train.en --target train.de \
--out vmap.txt``

A vocabulary map for translation shortlists (``python -m export SOURCE --vmap vmap.txt``), in
CTranslate2's vmap format, from parallel text: both sides are cut into the model's own tokens
(the artefact's tokenizer.json, whose pieces the service looks the rules up with), and each
source token allows the ``--per-token`` target tokens that co-occur with it most strongly by
the Dice coefficient over sentence pairs,

    dice(s, t) = 2 · pairs(s and t) / (pairs(s) + pairs(t)),

while the ``--always`` most frequent target tokens are allowed in every sentence (the line with
an empty source). A lexicon from word alignment (fast_align, eflomal), as CTranslate2's users
make, is sharper; this needs nothing but the training pairs. Plain text or gzip, one sentence a
line, the two files aligned.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from export.sources.ours.data import read_lines


def token_sets(tokenizer: Tokenizer, lines: Sequence[str]) -> Iterator[set[str]]:
    """Each line's distinct tokens, without the special tokens the post-processor adds."""
    for encoding in tokenizer.encode_batch(list(lines), add_special_tokens=False):
        yield set(encoding.tokens)


def build_vmap(
    tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str], per_token: int, always: int
) -> list[str]:
    """The map's lines: the always-allowed targets first, then one rule per source token."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines")
    source_count: Counter[str] = Counter()
    target_count: Counter[str] = Counter()
    both: Counter[tuple[str, str]] = Counter()
    for in_source, in_target in zip(
        token_sets(tokenizer, sources), token_sets(tokenizer, targets), strict=True
    ):
        source_count.update(in_source)
        target_count.update(in_target)
        both.update((s, t) for s in in_source for t in in_target)
    candidates: dict[str, list[tuple[float, str]]] = {}
    for (s, t), n in both.items():
        candidates.setdefault(s, []).append((2 * n / (source_count[s] + target_count[t]), t))
    lines = ["\t" + " ".join(t for t, _ in target_count.most_common(always))]
    for s in sorted(candidates):
        best = sorted(candidates[s], key=lambda c: (-c[0], c[1]))[:per_token]
        lines.append(f"{s}\t{' '.join(t for _, t in best)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.graphs.vmap", description=__doc__.split("\n\n")[1])
    p.add_argument("--tokenizer", type=Path, required=True, help="the model's tokenizer.json")
    p.add_argument("--source", type=Path, required=True, help="source sentences, one a line")
    p.add_argument("--target", type=Path, required=True, help="their translations, line by line")
    p.add_argument("--out", type=Path, required=True, help="the vmap file to write")
    p.add_argument("--per-token", type=int, default=20, help="target tokens a source token allows (20)")
    p.add_argument("--always", type=int, default=200, help="most frequent targets always allowed (200)")
    args = p.parse_args(argv)
    try:
        tokenizer = Tokenizer.from_file(str(args.tokenizer))
        lines = build_vmap(
            tokenizer, read_lines(args.source), read_lines(args.target), args.per_token, args.always
        )
    except Exception as e:  # OSError, ValueError; tokenizers raises plain Exception on a bad file
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(lines) - 1} source tokens, {args.always} always allowed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
