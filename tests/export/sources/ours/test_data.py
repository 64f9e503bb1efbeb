"""Tokenizer training, source/target encoding and token-budget batching."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from export.sources.ours.data import (
    OUTPUT_LIMIT_RULE,
    SPECIAL_TOKENS,
    Batch,
    encode_source,
    encode_target,
    length_sorted_batches,
    output_limits,
    pad,
    pad_array,
    read_parallel,
    token_batches,
    train_tokenizer,
)

WORDS = [
    *("a", "man", "woman", "dog", "cat", "rides", "runs", "the", "bike", "street"),
    *("über", "straße", "grün", "in", "on", "with", "two", "small", "big"),
]
PAD, BOS, EOS, UNK = 0, 1, 2, 3


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(corpus(200), vocab_size=120)


def test_special_tokens_have_ids_0_to_3(tok: Tokenizer) -> None:
    """<pad>, <s>, </s>, <unk> are ids 0, 1, 2, 3 and the vocabulary respects its budget."""
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]
    assert SPECIAL_TOKENS == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 40 < tok.get_vocab_size() <= 120


def test_encode_source_appends_eos_and_truncation_keeps_it(tok: Tokenizer) -> None:
    """Source = pieces + </s>, no <s>; truncated to max_len with </s> still last."""
    text = "two small dogs ride the big bike on the street."
    pieces = tok.encode(text, add_special_tokens=False).ids
    assert BOS not in pieces and EOS not in pieces
    (full,) = encode_source(tok, [text], max_len=100)
    assert full == [*pieces, EOS]
    (cut,) = encode_source(tok, [text], max_len=5)
    assert cut == [*pieces[:4], EOS]
    (exact,) = encode_source(tok, [text], max_len=len(full))
    assert exact == full


def test_encode_target_wraps_in_bos_and_eos(tok: Tokenizer) -> None:
    """Target = <s> + pieces + </s>; truncated to max_len keeping both ends."""
    texts = ["a man rides a bike.", "the cat runs in the street with two dogs."]
    for text, ids in zip(texts, encode_target(tok, texts, max_len=100), strict=True):
        assert ids == [BOS, *tok.encode(text, add_special_tokens=False).ids, EOS]
    (cut,) = encode_target(tok, texts[1:], max_len=6)
    assert (
        len(cut) == 6
        and cut[0] == BOS
        and cut[-1] == EOS
        and cut[1:5] == encode_target(tok, texts[1:], 100)[0][1:5]
    )


def test_decode_round_trips_text(tok: Tokenizer) -> None:
    """decode(encode(text)) == text, special tokens dropped, for sources and targets alike."""
    texts = [*corpus(20, seed=1), "grün über straße."]
    assert tok.decode_batch(encode_source(tok, texts, 200)) == texts
    assert tok.decode_batch(encode_target(tok, texts, 200)) == texts
    assert all(UNK not in ids for ids in encode_source(tok, texts, 200))


def test_read_parallel_checks_alignment(tmp_path: Path) -> None:
    """{split}.{lang} files are read line-aligned; mismatched line counts are an error."""
    (tmp_path / "train.en").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("x\ny\n", encoding="utf-8")
    assert read_parallel(tmp_path, "train") == (["a", "b"], ["x", "y"])
    (tmp_path / "val.en").write_text("a\n", encoding="utf-8")
    (tmp_path / "val.de").write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lines"):
        read_parallel(tmp_path, "val")
    with pytest.raises(FileNotFoundError):
        read_parallel(tmp_path, "test")


def pairs(n: int = 120, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    src = [[rng.randint(4, 99) for _ in range(rng.randint(1, 20))] + [EOS] for _ in range(n)]
    tgt = [[BOS] + [rng.randint(4, 99) for _ in range(rng.randint(1, 20))] + [EOS] for _ in range(n)]
    src.append([5] * 40 + [EOS])  # one pair alone over the budget
    tgt.append([BOS, 6, EOS])
    return src, tgt


def strip(row: torch.Tensor) -> tuple[int, ...]:
    ids = row.tolist()
    while ids and ids[-1] == PAD:
        ids.pop()
    return tuple(ids)


def test_token_batches_cover_every_pair_once_within_budget() -> None:
    """Each pair appears exactly once; rows × longest side ≤ max_tokens unless a batch is one pair;
    tgt_out is tgt_in shifted by one; n_tokens counts the non-pad target tokens."""
    src, tgt = pairs()
    max_tokens = 64
    seen: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for b in token_batches(src, tgt, max_tokens, PAD, seed=3):
        rows = b.src.size(0)
        assert b.tgt_in.shape == b.tgt_out.shape and b.tgt_in.size(0) == rows
        padded = rows * max(b.src.size(1), b.tgt_in.size(1) + 1)
        assert padded <= max_tokens or rows == 1, f"{rows} rows use {padded} padded tokens"
        assert (b.tgt_in[:, 0] == BOS).all()
        assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])
        assert b.n_tokens == int((b.tgt_out != PAD).sum())
        for s, t_in, t_out in zip(b.src, b.tgt_in, b.tgt_out, strict=True):
            full_tgt = strip(torch.cat([t_in[:1], t_out]))
            seen[strip(s), full_tgt] += 1
    expected = Counter(zip(map(tuple, src), map(tuple, tgt), strict=True))
    assert seen == expected
    assert sum(b.n_tokens for b in token_batches(src, tgt, max_tokens, PAD)) == sum(len(t) - 1 for t in tgt)


def batches_as_lists(batches: list[Batch]) -> list[list[list[int]]]:
    return [b.src.tolist() + b.tgt_in.tolist() + b.tgt_out.tolist() for b in batches]


def test_token_batches_are_deterministic_for_a_seed() -> None:
    """The same seed gives the same batches; another seed reorders them; no seed is length order."""
    src, tgt = pairs()
    one = batches_as_lists(list(token_batches(src, tgt, 64, PAD, seed=7)))
    assert one == batches_as_lists(list(token_batches(src, tgt, 64, PAD, seed=7)))
    assert one != batches_as_lists(list(token_batches(src, tgt, 64, PAD, seed=8)))
    plain = list(token_batches(src, tgt, 64, PAD))
    widths = [b.src.size(1) for b in plain]
    assert widths == sorted(widths)


def test_output_limits_per_sentence_capped_by_the_model() -> None:
    """2 × source tokens + 10, never beyond max_target_len - 1 (the start token's position)."""
    assert output_limits([[5] * 3, [5] * 40, []], max_target_len=64) == [16, 63, 10]
    assert OUTPUT_LIMIT_RULE.startswith("min(2 * source tokens + 10, max_target_len - 1)")


def test_length_sorted_batches_cover_every_index_once_in_length_order() -> None:
    lengths = [5, 1, 9, 3, 7]
    batches = length_sorted_batches(lengths, 2)
    assert batches == [[1, 3], [0, 4], [2]]


def test_pad_and_pad_array_right_pad_to_the_longest() -> None:
    expected = [[4, 5, 6], [7, 0, 0]]
    assert pad_array([[4, 5, 6], [7]], 0).tolist() == expected
    padded = pad([[4, 5, 6], [7]], 0)
    assert padded.dtype == torch.long and padded.tolist() == expected
