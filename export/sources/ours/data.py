"""Parallel corpus reading, the joint subword tokenizer, and token-budget batches."""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.processors import TemplateProcessing

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3


def special_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise ValueError(f"tokenizer has no {token} token")
    return i


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def split_file(data_dir: Path, split: str, lang: str) -> Path:
    """``{split}.{lang}.gz``, else ``{split}.{lang}``, in ``data_dir``."""
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (data_dir / name).exists():
            return data_dir / name
    raise FileNotFoundError(f"no {split}.{lang}[.gz] in {data_dir}")


def read_parallel(
    data_dir: Path, split: str, src: str = "en", tgt: str = "de"
) -> tuple[list[str], list[str]]:
    """Read ``{split}.{src}[.gz]`` and ``{split}.{tgt}[.gz]`` as aligned sentence lists."""
    sources = read_lines(split_file(data_dir, split, src))
    targets = read_lines(split_file(data_dir, split, tgt))
    if len(sources) != len(targets):
        raise ValueError(f"{split}: {len(sources)} {src} lines but {len(targets)} {tgt} lines")
    return sources, targets


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """A joint BPE vocabulary in SentencePiece style (▁ marks word starts), NFKC-normalised.

    Encoding appends </s> (the source format); targets are wrapped in <s> … </s> by
    ``encode_target``.
    """
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, tok.token_to_id(EOS))])
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, f"{token} must have id {i}"
    return tok


def encode_source(tok: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """ids + [</s>], truncated to max_len keeping the </s>."""
    out = []
    for enc in tok.encode_batch(list(texts)):
        ids = enc.ids
        out.append(ids if len(ids) <= max_len else [*ids[: max_len - 1], ids[-1]])
    return out


def encode_target(tok: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """[<s>] + ids + [</s>], truncated to max_len."""
    bos, eos = special_id(tok, BOS), special_id(tok, EOS)
    return [
        [bos, *enc.ids[: max_len - 2], eos] for enc in tok.encode_batch(list(texts), add_special_tokens=False)
    ]


@dataclass(frozen=True)
class Batch:
    src: torch.Tensor  # (B, S)
    tgt_in: torch.Tensor  # (B, T): <s> y_1 … y_n
    tgt_out: torch.Tensor  # (B, T): y_1 … y_n </s>
    n_tokens: int  # real target tokens

    def to(self, device: torch.device) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.n_tokens)


def pad_array(seqs: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    """Right-padded to the longest sequence: int64 (B, T)."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = s
    return ids


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    return torch.from_numpy(pad_array(seqs, pad_id))


def output_limits(src_ids: Sequence[Sequence[int]], max_target_len: int) -> list[int]:
    """Each sentence's own output limit, as a translation service caps it: 2 × its source tokens
    + 10, never beyond the model's positions (``max_target_len`` - 1: one is the start token).
    Per sentence, so that a translation does not depend on what shares its batch."""
    return [min(max_target_len - 1, 2 * len(s) + 10) for s in src_ids]


OUTPUT_LIMIT_RULE = "min(2 * source tokens + 10, max_target_len - 1) output tokens per sentence"


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in order of length, cut into batches of ``batch_size`` (little padding per batch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def token_batches(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    max_tokens: int,
    pad_id: int,
    seed: int | None = None,
) -> Iterator[Batch]:
    """Batches of length-sorted pairs whose padded size (rows × longest side) fits max_tokens.

    With a seed, lengths are broken by random ties and the batch order is shuffled, so every
    epoch sees different neighbours yet little padding.
    """
    rng = random.Random(seed)
    order = sorted(
        range(len(src)),
        key=lambda i: (len(src[i]), len(tgt[i]), rng.random() if seed is not None else i),
    )
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_next = max(longest, len(src[i]), len(tgt[i]))
        if current and longest_next * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, longest_next = [], max(len(src[i]), len(tgt[i]))
        current.append(i)
        longest = longest_next
    if current:
        groups.append(current)
    if seed is not None:
        rng.shuffle(groups)
    for g in groups:
        t = pad([tgt[i] for i in g], pad_id)
        yield Batch(
            src=pad([src[i] for i in g], pad_id),
            tgt_in=t[:, :-1],
            tgt_out=t[:, 1:],
            n_tokens=int((t[:, 1:] != pad_id).sum()),
        )
