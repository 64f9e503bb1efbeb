"""The tokenizer wrapper: truncation policy per item, padding, counts, token strings; the cut of
a length-sorted batch into padded runs."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from service.artefacts import ArtefactError
from service.engine.base import TextTooLong
from service.engine.tokenizer import RUN_COST_TOKENS, Encoded, SubBatches, TextTokenizer, padded_partition

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d", "e"]


def word_tokenizer(pad_to: int | None = None) -> Tokenizer:
    """Whitespace words, </s> appended, optionally with the file's own padding/truncation set."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(WORDS[:4])
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    if pad_to:
        tok.enable_padding(length=pad_to, pad_id=0, pad_token="<pad>")
        tok.enable_truncation(pad_to)
    return tok


def test_over_long_texts_fail_alone_or_are_cut_keeping_eos() -> None:
    t = TextTokenizer(word_tokenizer(pad_to=16), max_len=4, pad_id=0)
    out = t.encode_batch(["a b", "a b c d e", "a b c d e", ""], [False, False, True, False])
    assert out[0] == Encoded([4, 5, 2], ["a", "b", "</s>"], truncated=False)  # the file's padding is off
    assert isinstance(out[1], TextTooLong) and "6 tokens" in str(out[1])
    assert out[2] == Encoded([4, 5, 6, 2], ["a", "b", "c", "</s>"], truncated=True)
    assert isinstance(out[3], Encoded) and out[3].ids == [2]
    assert t.count("a b c d e") == 6  # counts ignore truncation


def test_pad_to_longest_with_mask() -> None:
    t = TextTokenizer(word_tokenizer(), max_len=8, pad_id=0)
    ids, mask = t.pad([[4, 5, 2], [6, 2]])
    np.testing.assert_array_equal(ids, [[4, 5, 2], [6, 2, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 0]])
    assert ids.dtype == mask.dtype == np.int64


def test_decode_skips_specials_and_maps_ids_to_pieces() -> None:
    t = TextTokenizer(word_tokenizer(), max_len=8, pad_id=0)
    assert t.decode_batch([[4, 5, 2], []]) == ["a b", ""]
    assert t.id_to_tokens([4, 2, 99]) == ["a", "</s>", ""]


def test_bad_tokenizer_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{broken", encoding="utf-8")
    with pytest.raises(ArtefactError, match=str(path)):
        TextTokenizer.from_file(path, 8, 0)


def test_given_whole_encodings_are_taken_as_they_are_and_the_length_policy_still_applies() -> None:
    t = TextTokenizer(word_tokenizer(), max_len=4, pad_id=0)
    whole = t.encode(["a b c d e"])[0]
    assert whole == Encoded([4, 5, 6, 7, 8, 2], ["a", "b", "c", "d", "e", "</s>"], truncated=False)
    marked = Encoded([7, 2], ["d", "</s>"], truncated=False)  # not "a b"'s own: used as given
    out = t.encode_batch(
        ["a b c d e", "a b", "c", "a b c d e"], [True, True, True, False], [whole, marked, None, whole]
    )
    assert out[0] == Encoded([4, 5, 6, 2], ["a", "b", "c", "</s>"], truncated=True)
    assert out[1] is marked
    assert out[2] == Encoded([6, 2], ["c", "</s>"], truncated=False)  # not given: tokenized here
    assert isinstance(out[3], TextTooLong) and "6 tokens" in str(out[3])


def _partition_cost(lengths: list[int], cuts: list[tuple[int, int]]) -> int:
    return sum(RUN_COST_TOKENS + (end - start) * lengths[end - 1] for start, end in cuts)


def test_padded_partition_splits_off_what_would_be_mostly_padding() -> None:
    assert padded_partition([12] * 40, 64, 16384) == [(0, 40)]  # one length: one run
    assert padded_partition([5] * 20 + [50], 64, 16384) == [(0, 20), (20, 21)]
    assert padded_partition([3, 4, 5, 6], 2, 16384) == [(0, 2), (2, 4)]  # max_rows
    assert padded_partition([3, 4, 5, 6], 64, 10) == [(0, 2), (2, 3), (3, 4)]  # max_tokens
    assert padded_partition([100], 64, 10) == [(0, 1)]  # one row may exceed the budget
    assert padded_partition([], 64, 10) == []


def test_on_a_device_a_batch_is_cut_only_where_its_limits_force() -> None:
    """On CUDA a run costs its launches, not its padding: short and long sentences share a run
    while the tokens allow (the rows are bounded by the tokens only), where the CPU's run cost
    splits them."""
    lengths = dict(enumerate([5] * 20 + [50]))
    cpu, device = SubBatches(64, 16384), SubBatches(64, 16384).on_device()
    assert cpu.cut(lengths) == [list(range(20)), [20]]
    assert device.cut(lengths) == [list(range(21))]
    assert SubBatches(8, 16384).on_device().cut(lengths) == [list(range(21))]
    assert SubBatches(8, 16384).cut(dict(enumerate([5] * 20))) == [list(range(i, i + 8)) for i in (0, 8)] + [
        list(range(16, 20))
    ]
    assert SubBatches(64, 500).on_device().cut(lengths) == [list(range(20)), [20]]  # 21 × 50 > 500


def test_a_device_run_is_padded_to_a_few_shapes_and_a_cpu_run_is_not() -> None:
    """Rows up to a multiple of 8, the length up to one of 16 but never past the model's."""
    device = SubBatches().on_device()
    assert device.run_shape(5, 17, 128) == (8, 32)
    assert device.run_shape(8, 16, 128) == (8, 16)
    assert device.run_shape(9, 120, 126) == (16, 126)
    assert SubBatches().run_shape(5, 17, 128) == (5, 17)


def test_pad_fills_the_rows_and_columns_a_run_shape_asks_for() -> None:
    """Real rows keep their ids and mask; the rows added hold one pad token each, so that every
    row of the run is a valid input whose output is dropped."""
    t = TextTokenizer(word_tokenizer(), max_len=8, pad_id=0)
    ids, mask = t.pad([[5, 6, 7], [8]], rows=4, width=5)
    assert ids.tolist() == [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [0] * 5, [0] * 5]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    same_ids, same_mask = t.pad([[5, 6, 7], [8]])
    assert same_ids.shape == same_mask.shape == (2, 3)


def test_padded_partition_is_the_cheapest_partition() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = sorted(rng.randint(1, 60) for _ in range(rng.randint(1, 9)))
        max_rows, max_tokens = rng.randint(1, 9), rng.randint(20, 300)
        n = len(lengths)
        feasible = []
        for mask in itertools.product([False, True], repeat=n - 1):
            bounds = [0, *[i + 1 for i, cut in enumerate(mask) if cut], n]
            cuts = list(itertools.pairwise(bounds))
            fits = [
                e - s <= max_rows and (e - s == 1 or (e - s) * lengths[e - 1] <= max_tokens) for s, e in cuts
            ]
            if all(fits):
                feasible.append(_partition_cost(lengths, cuts))
        got = padded_partition(lengths, max_rows, max_tokens)
        assert [i for s, e in got for i in range(s, e)] == list(range(n))
        assert _partition_cost(lengths, got) == min(feasible)
