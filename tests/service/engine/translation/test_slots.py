"""engine/translation/slots.py: row slots for the cache, one memory slot per sentence whatever its beams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation import slots
from service.engine.translation.folding import fold_beams
from service.engine.translation.running import RunningDecode
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis
from service.engine.translation.slots import SlotDecoder
from service.engine.translation.translator import OnnxTranslator

TEXTS = ["a small cat sits on the big red street", "two dogs run", "red"]


@pytest.fixture(scope="module")
def translator(translation_artefact: Path) -> OnnxTranslator:
    return OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))


def test_each_row_folds_onto_its_sentence_padded_to_a_width_of_two_at_least() -> None:
    # rows 0-3 decode sentence 7, row 4 sentence 3, rows 5-6 sentence 9; memory slots hold 9, 7, 3
    sentence_rows, beam_index = fold_beams(np.array([7, 7, 7, 7, 3, 9, 9]), np.array([9, 7, 3]))
    assert sentence_rows.tolist() == [[5, 6, 5, 5], [0, 1, 2, 3], [4, 4, 4, 4]]
    assert beam_index.tolist() == [4, 5, 6, 7, 8, 0, 1]
    assert np.array_equal(sentence_rows.reshape(-1)[beam_index], np.arange(7))  # every row comes back
    greedy_rows, greedy_index = fold_beams(np.array([5, 2]), np.array([2, 5]))
    assert greedy_rows.tolist() == [[1, 1], [0, 0]] and greedy_index.tolist() == [2, 0]


def decode_all(decode: RunningDecode, gone: str | None = None) -> dict[str, list[TokenHypothesis]]:
    """Step until every sentence is done (taking ``gone`` out after the first step)."""
    done: dict[str, list[TokenHypothesis]] = {}
    first = True
    while decode.sentences:
        finished: list[SentenceSearch] = decode.step()
        if first and gone is not None:
            decode.remove(lambda s: s.key == gone)
        first = False
        done.update((s.key, s.results()) for s in finished)
    return done


def test_a_sentence_holds_one_memory_for_all_its_beams_and_frees_it_when_it_leaves(
    translator: OnnxTranslator,
) -> None:
    """Sentences of beams 4, 1 and 3 hold 3 memory slots for 8 rows; after the first leaves, the
    others decode exactly as alone."""
    beams = {"long": 4, "short": 1, "one": 3}
    options = {key: TranslateOptions(beam_size=k, max_length=12) for key, k in beams.items()}
    items = [TranslateItem(text, options[key]) for key, text in zip(beams, TEXTS, strict=True)]
    results: list[Translation | Exception | None] = [None] * len(items)
    encoded = translator.prepare(items, results)
    decode = translator.new_decode()
    decode.admit([(key, encoded[i], options[key]) for i, key in enumerate(beams)])
    decoder = decode.decoder
    assert isinstance(decoder, SlotDecoder)
    assert decoder.rows == 8 and decoder.sentences == 3
    assert all(b.shape[0] == 3 for b in decoder._memory)  # not one per row
    together = decode_all(decode, gone="long")  # the first sentence leaves after one step
    assert decoder.rows == decoder.sentences == 0 and decoder.nbytes == 0
    assert set(together) == {"short", "one"}
    for key, i in (("short", 1), ("one", 2)):
        alone = translator.new_decode()
        alone.admit([(key, encoded[i], options[key])])
        (want,) = decode_all(alone).values()
        # the same tokens and the very same scores: a step's width never changes a sentence's sums
        assert [(h.tokens, h.score) for h in together[key]] == [(h.tokens, h.score) for h in want]


def test_a_row_scores_the_same_whatever_the_width_of_the_folded_step(translator: OnnxTranslator) -> None:
    """The folded cross-attention sums each query alone: a sentence's block padded to any width
    of 2 or more gives the same bits (fold_beams never makes a narrower one)."""
    decoder = translator.backend.decoder
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([[5]]),
        "positions": np.array([3]),
        "top_k": np.array([4]),
    }
    for spec in decoder.get_inputs():
        if spec.name.startswith(("memory_", "cache_")):
            length = 23 if spec.name.startswith("memory_") else 5
            feeds[spec.name] = rng.standard_normal((1, spec.shape[1], length, spec.shape[3])).astype(
                np.float32
            )
    feeds["source_mask"] = (np.arange(23) < 19)[None].astype(np.int64)
    outputs = ["log_probs", "cross_attention"]
    fold = {"beam_index": np.array([0])}
    widths = [
        decoder.run(outputs, {**feeds, **fold, "sentence_rows": np.zeros((1, w), np.int64)})
        for w in (2, 3, 4, 7)
    ]
    for other in widths[1:]:
        for want, have in zip(widths[0], other, strict=True):
            assert np.array_equal(want, have)


@pytest.mark.parametrize("path", ["row by row", "whole arrays"])
def test_a_reorder_copies_only_the_columns_that_differ_and_every_row_gets_its_whole_history(
    translator: OnnxTranslator, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Beams that share their first tokens share those cache columns: a row that takes another
    row's history gets only the columns from the first one computed apart to its source's last,
    and then holds exactly that row's history; whether a few rows move (one by one) or many (in
    one gather and scatter)."""
    copies: list[int] = []  # columns copied, per reorder
    columns_of, differing = slots.copied_columns, SlotDecoder._differing

    def counted(first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        which, columns = columns_of(first, end)
        copies.append(len(columns))
        return which, columns

    def counted_rows(self: SlotDecoder, moved: list[int], src: list[int]) -> list[tuple[int, int, int, int]]:
        apart = differing(self, moved, src)
        copies.append(sum(end - first for _, _, first, end in apart))
        return apart

    monkeypatch.setattr(slots, "copied_columns", counted)
    monkeypatch.setattr(SlotDecoder, "_differing", counted_rows)
    monkeypatch.setattr(slots, "_FEW_MOVED", 4 if path == "row by row" else 0)
    options = TranslateOptions(beam_size=4)
    decode = translator.new_decode()
    decode.admit([("a", translator.encode([TEXTS[0]])[0], options)])
    decoder = decode.decoder
    assert isinstance(decoder, SlotDecoder) and decoder.rows == 4
    tokens = np.arange(4, dtype=np.int64) + 10
    # the rows a reorder keeps, after each step: row 0's first column goes to the three others;
    # then only the second of rows 0 and 1 (all four share the first); then rows 0, 2 and 3
    # differ from their sources from the second column on, row 1 at the third; then rows 1, 2
    # and 3 differ from row 0 at the fourth, third and second
    plan = [[0, 0, 0, 0], [0, 1, 0, 1], [3, 3, 1, 2], [0, 0, 0, 0]]
    copied = [3, 2, 2 + 1 + 2 + 2, 1 + 2 + 3]
    for rows, columns in zip(plan, copied, strict=True):
        decoder.step_candidates(tokens, 8)
        length = int(decoder._positions[:4].max())
        before = [b[:4].copy() for b in decoder._cache]
        decoder.reorder(np.array(rows))
        assert copies.pop() == columns
        for buffer, old in zip(decoder._cache, before, strict=True):
            assert all(np.array_equal(buffer[i, :, :length], old[r, :, :length]) for i, r in enumerate(rows))
