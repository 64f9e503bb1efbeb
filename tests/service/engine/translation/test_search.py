"""Greedy and beam search (service/engine/translation/search.py) against scripted decoders (over the PyTorch
model: tests/export/sources/ours/test_translate.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from service.engine.translation.candidates import Candidates
from service.engine.translation.search import Search
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis

PAD, BOS, EOS, A, B, C = range(6)
V, S = 6, 3  # vocabulary, source length
Table = dict[tuple[int, ...], dict[int, float]]


def distribution(table: Table, prefix: tuple[int, ...], default: dict[int, float]) -> np.ndarray:
    """Probabilities for the next token: the table's entry (or ``default``); the mass left over is
    spread evenly over the other word tokens; <pad>/<s> and unlisted tokens get ~0."""
    given = table.get(prefix, default)
    probs = np.full(V, 1e-9)
    for token, p in given.items():
        probs[token] = p
    rest = [t for t in (A, B, C) if t not in given]
    left = 1.0 - sum(given.values())
    if rest and left > 1e-9:
        probs[rest] = left / len(rest)
    return probs / probs.sum()


class ScriptedDecoder:
    """Log-probs read from a fixed table per sentence, keyed by the generated prefix.

    The decoder keeps its own per-row state (sentence, prefix) and permutes it on ``reorder``, as a
    real key/value cache would; a search that loses track of rows gets the wrong log-probs.
    Attention row = (step index, token fed, sentence), so alignments can be traced back.
    """

    def __init__(
        self, tables: Sequence[Table], default: dict[int, float] | None = None, attention: bool = True
    ):
        self.tables = list(tables)
        self.default = default if default is not None else {EOS: 0.9}
        self.attention = attention
        self.sent = np.arange(len(tables))
        self.fed: list[tuple[int, ...]] = [() for _ in tables]
        self.reorder_sizes: list[int] = []
        self.step_sizes: list[int] = []

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        assert last_tokens.dtype == np.int64 and len(last_tokens) == len(self.sent)
        self.step_sizes.append(len(last_tokens))
        self.fed = [(*f, int(t)) for f, t in zip(self.fed, last_tokens, strict=True)]
        logp = np.stack(
            [
                np.log(distribution(self.tables[s], f[1:], self.default))
                for s, f in zip(self.sent, self.fed, strict=True)
            ]
        )
        attn = np.array(
            [[len(f) - 1, f[-1], s] for s, f in zip(self.sent, self.fed, strict=True)], dtype=np.float32
        )
        return logp.astype(np.float32), attn if self.attention else None

    def reorder(self, rows: np.ndarray) -> None:
        assert rows.dtype == np.int64 and (rows < len(self.sent)).all()
        self.reorder_sizes.append(len(rows))
        self.sent = self.sent[rows]
        self.fed = [self.fed[r] for r in rows]


def search(
    tables: Sequence[Table],
    beam: int,
    max_len: int | list[int] = 10,
    default: dict[int, float] | None = None,
    n_best: int = 1,
    length_penalty: float = 1.0,
) -> tuple[list[list[TokenHypothesis]], ScriptedDecoder]:
    dec = ScriptedDecoder(tables, default)
    hyps = beam_search(
        dec, len(tables), beam_size=beam, max_len=max_len, bos_id=BOS, eos_id=EOS,
        n_best=n_best, length_penalty=length_penalty,
    )  # fmt: skip
    return hyps, dec


def table_logprob(
    table: Table, tokens: Sequence[int], ended: bool, default: dict[int, float] | None = None
) -> float:
    seq = [*tokens, EOS] if ended else list(tokens)
    d = default if default is not None else {EOS: 0.9}
    return sum(math.log(distribution(table, tuple(seq[:i]), d)[t]) for i, t in enumerate(seq))


# A sentence where the greedy first choice (A, p=.6) leads to a poor ending (</s> at .4), while
# B (p=.4) is followed by a confident </s> (.9): log .4 + log .9 > log .6 + log .4.
TRAP: Table = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.4, A: 0.3, B: 0.3}, (B,): {EOS: 0.9}}


def test_greedy_follows_the_argmax_path() -> None:
    """beam_size=1 takes the most probable token at every step until </s>."""
    tables: list[Table] = [TRAP, {(): {C: 0.5, A: 0.3}, (C,): {C: 0.7}, (C, C): {B: 0.6}}]
    hyps, _ = search(tables, beam=1)
    for table, h in zip(tables, hyps, strict=True):
        prefix: tuple[int, ...] = ()
        while (t := int(np.argmax(distribution(table, prefix, {EOS: 0.9})))) != EOS:
            prefix += (t,)
        assert h[0].tokens == list(prefix)
        assert h[0].score == pytest.approx(table_logprob(table, prefix, True) / (len(prefix) + 1), rel=1e-5)
    assert [h[0].tokens for h in hyps] == [[A], [C, C, B]]


def test_beam_finds_the_better_sequence_greedy_misses() -> None:
    """With two beams the search keeps B alive and ends with the higher-scoring [B]."""
    greedy, _ = search([TRAP], beam=1)
    beam, _ = search([TRAP], beam=2)
    assert greedy[0][0].tokens == [A] and beam[0][0].tokens == [B]
    assert beam[0][0].score > greedy[0][0].score
    assert beam[0][0].score == pytest.approx(math.log(0.4 * 0.9) / 2, rel=1e-5)


def test_n_best_is_sorted_distinct_and_scored_by_the_formula() -> None:
    """n_best hypotheses come best first, are distinct, and score = Σ log p / length^α (</s> counted)."""
    default = {EOS: 0.4, A: 0.3, B: 0.2, C: 0.1}
    tables: list[Table] = [{}, {(): {B: 0.5}}]
    for alpha in (0.0, 0.6, 1.0):
        hyps, _ = search(tables, beam=4, n_best=4, default=default, length_penalty=alpha)
        for table, h in zip(tables, hyps, strict=True):
            assert len(h) == 4
            assert len({tuple(x.tokens) for x in h}) == 4
            scores = [x.score for x in h]
            assert scores == sorted(scores, reverse=True)
            for x in h:
                expected = table_logprob(table, x.tokens, True, default) / (len(x.tokens) + 1) ** alpha
                assert x.score == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="n_best"):
        search([{}], beam=2, n_best=3)


def test_length_penalty_changes_the_ranking() -> None:
    """A short [A] (log p -1.20) beats a long [B B B] (log p -1.89) by total log-prob, but loses once
    scores are divided by the length (-0.60 vs -0.47)."""
    table: Table = {
        (): {A: 0.3, B: 0.7},
        (A,): {EOS: 1.0},
        (B,): {B: 0.6, EOS: 0.38, A: 0.01, C: 0.01},
        (B, B): {B: 0.6, EOS: 1e-4},
        (B, B, B): {EOS: 0.6},
    }
    raw, _ = search([table], beam=2, n_best=2, length_penalty=0.0)
    normalised, _ = search([table], beam=2, n_best=2, length_penalty=1.0)
    assert [h.tokens for h in raw[0]] == [[A], [B, B, B]]
    assert [h.tokens for h in normalised[0]] == [[B, B, B], [A]]
    assert normalised[0][0].score == pytest.approx(math.log(0.7 * 0.6 * 0.6 * 0.6) / 4, rel=1e-5)


# Two beams: "" (</s> first, log .3) and [A] (</s> at step 2) finish by then, while A C runs on
# to a better normalised score: log(.5 · .55 · .95) / 3 = -0.45 beats [A]'s log(.5 · .45) / 2.
LATE_BLOOMER: Table = {
    (): {A: 0.5, EOS: 0.3, B: 0.2},
    (A,): {EOS: 0.45, C: 0.55},
    (B,): {C: 1.0},
    (A, C): {EOS: 0.95},
}


def test_early_stopping_decides_whether_the_search_goes_on_after_beam_size_finished() -> None:
    """Hugging Face's early_stopping: True stops at 2 finished hypotheses ([A] best); False goes on
    while the best running beam, normalised at its length, beats the worst finished one, and
    keeps the 2 best: [A C] and [B C] (log(.2 · .9) / 3)."""
    found = {}
    for rule in (True, False):
        dec = ScriptedDecoder([LATE_BLOOMER])
        (hyps,) = beam_search(
            dec, 1, beam_size=2, max_len=10, bos_id=BOS, eos_id=EOS, n_best=2, early_stopping=rule
        )
        found[rule] = ([h.tokens for h in hyps], len(dec.step_sizes))
    assert found[True] == ([[A], []], 2)
    assert found[False] == ([[A, C], [B, C]], 3)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("max_len", [1, 4])
def test_max_len_is_respected(beam: int, max_len: int) -> None:
    """A decoder that never wants </s> stops after max_len steps with max_len tokens."""
    never_end = {A: 0.5, B: 0.3, C: 0.2}
    hyps, dec = search([{}, {}], beam=beam, n_best=beam, max_len=max_len, default=never_end)
    assert len(dec.step_sizes) == max_len
    for h in hyps:
        assert len(h) == beam
        assert all(len(x.tokens) == max_len for x in h)
        assert h[0].tokens == [A] * max_len
        assert h[0].score == pytest.approx(math.log(0.5), rel=1e-5)  # unfinished: length = max_len


def test_max_len_per_sentence() -> None:
    """A limit per sentence: each stops at its own max_len, as if searched alone."""
    never_end = {A: 0.5, B: 0.3, C: 0.2}
    hyps, dec = search([{}, {}, {}], beam=2, n_best=2, max_len=[2, 5, 3], default=never_end)
    assert [len(h[0].tokens) for h in hyps] == [2, 5, 3]
    assert dec.step_sizes == [6, 6, 4, 2, 2]  # rows leave as their sentences reach their limits
    for limit, h in zip([2, 5, 3], hyps, strict=True):
        (alone,), _ = search([{}], beam=2, n_best=2, max_len=limit, default=never_end)
        assert [x.tokens for x in h] == [x.tokens for x in alone]


def test_finished_sentences_leave_the_batch() -> None:
    """Once a sentence has beam_size finished hypotheses its rows are dropped from the decoder."""
    short: Table = {(): {EOS: 0.5, A: 0.45}, (A,): {EOS: 0.9}}
    long: Table = {(): {A: 0.9}, (A,): {A: 0.9}, (A, A): {A: 0.9}, (A, A, A): {A: 0.9}}
    hyps, dec = search([short, long], beam=2, max_len=8)
    assert dec.reorder_sizes[:3] == [4, 4, 2], dec.reorder_sizes
    assert dec.step_sizes[:3] == [4, 4, 2]
    assert min(dec.step_sizes) == 2
    assert hyps[0][0].tokens == [A] and hyps[1][0].tokens == [A, A, A, A]


def test_alignments_follow_the_hypothesis_rows() -> None:
    """alignment has shape (len(tokens), S); row i is the attention of the step that produced token i."""
    default = {EOS: 0.4, A: 0.3, B: 0.2, C: 0.1}
    tables: list[Table] = [TRAP, {}]
    hyps, _ = search(tables, beam=3, n_best=3, default=default, max_len=3)
    for sent, h in enumerate(hyps):
        for x in h:
            assert x.alignment is not None and x.alignment.shape == (len(x.tokens), S)
            fed = [BOS, *x.tokens][: len(x.tokens)]
            np.testing.assert_array_equal(x.alignment[:, 0], np.arange(len(x.tokens)))
            np.testing.assert_array_equal(x.alignment[:, 1], fed)
            assert (x.alignment[:, 2] == sent).all()
    no_attn = ScriptedDecoder([TRAP], attention=False)
    (h,) = beam_search(no_attn, 1, beam_size=2, max_len=5, bos_id=BOS, eos_id=EOS)
    assert h[0].alignment is None


@pytest.mark.parametrize("vocab", [6, 64, 130, 8000, 19001])
@pytest.mark.parametrize("beam", [1, 4])
def test_block_top_k_equals_a_full_sort(vocab: int, beam: int) -> None:
    """The block pre-selection finds exactly the best continuations a full sort of every
    candidate finds, with -inf log-probs and dead beams (-inf scores) among them."""
    from service.engine.translation.ranking import best_continuations

    rng = np.random.default_rng(vocab + beam)
    sentences, n = 5, 2 * beam
    logp = np.log(rng.dirichlet(np.full(vocab, 0.3), size=sentences * beam)).astype(np.float32)
    logp[rng.random(logp.shape) < 0.05] = -np.inf
    for scores in (rng.normal(size=sentences * beam) * 3, np.tile([0.0] + [-np.inf] * (beam - 1), sentences)):
        rows, tokens, got = best_continuations(scores, logp, beam, n)
        cand = (scores[:, None] + logp).reshape(sentences, beam * vocab)
        want = np.sort(cand, axis=1)[:, ::-1][:, :n]
        np.testing.assert_array_equal(got, want)
        for j in range(sentences):
            for r, t, s in zip(rows[j], tokens[j], got[j], strict=True):
                row = j * beam + r  # r: the row within the sentence's block
                assert 0 <= r < beam and (s == -np.inf or scores[row] + logp[row, t] == s)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_abandoned_sentence_leaves_at_the_next_step_and_the_others_are_unchanged(beam: int) -> None:
    never_ends = {A: 0.6, B: 0.3, EOS: 1e-6}  # runs to max_len unless stopped
    tables: list[Table] = [{}, {}, {}]
    alone, _ = search(tables, beam, max_len=30, default=never_ends)
    flags = [False, False, False]
    decoder = ScriptedDecoder(tables, never_ends)
    steps = 0

    def abandoned() -> list[bool]:
        nonlocal steps
        steps += 1
        if steps == 5:
            flags[1] = True  # its client left after four steps
        return flags

    found = beam_search(decoder, 3, beam_size=beam, max_len=30, bos_id=BOS, eos_id=EOS, abandoned=abandoned)
    assert found[1] == []  # gone after four steps, nothing finished
    for i in (0, 2):
        assert [(h.tokens, h.score) for h in found[i]] == [(h.tokens, h.score) for h in alone[i]]
    assert decoder.step_sizes[3] == 3 * beam and decoder.step_sizes[4] == 2 * beam  # one step later


def test_the_search_ends_at_once_when_every_sentence_is_abandoned() -> None:
    decoder = ScriptedDecoder([{}, {}], {A: 0.9, EOS: 1e-6})
    found = beam_search(
        decoder, 2, beam_size=2, max_len=200, bos_id=BOS, eos_id=EOS, abandoned=lambda: [True, True]
    )
    assert found == [[], []] and decoder.step_sizes == []


@pytest.mark.parametrize("vocab", [6, 130, 8000])
@pytest.mark.parametrize("beam", [1, 4])
def test_ranking_each_rows_top_candidates_equals_the_full_vocabulary_ranking(vocab: int, beam: int) -> None:
    """What a graph's TopK hands the search (each row's 2·beam best tokens) ranks to exactly the
    continuations the full (rows, vocab) log-probs give, dead beams and -inf log-probs included."""
    from service.engine.translation.ranking import best_candidates, best_continuations

    rng = np.random.default_rng(vocab * 7 + beam)
    sentences, n = 5, 2 * beam
    logp = np.log(rng.dirichlet(np.full(vocab, 0.3), size=sentences * beam)).astype(np.float32)
    logp[rng.random(logp.shape) < 0.05] = -np.inf
    width = min(n, vocab)
    order = np.argsort(-logp, axis=1, kind="stable")[:, :width]
    candidates = np.take_along_axis(logp, order, 1), order.astype(np.int64)
    for scores in (rng.normal(size=sentences * beam) * 3, np.tile([0.0] + [-np.inf] * (beam - 1), sentences)):
        rows, tokens, got = best_candidates(scores, *candidates, beam, n)
        want_rows, want_tokens, want = best_continuations(scores, logp, beam, n)
        np.testing.assert_array_equal(got, want)
        finite = [[s != -np.inf for s in row] for row in got]
        for j in range(sentences):  # the same (row, token) wherever the score is finite
            pick = [i for i, f in enumerate(finite[j]) if f]
            assert [(rows[j][i], tokens[j][i]) for i in pick] == [
                (want_rows[j][i], want_tokens[j][i]) for i in pick
            ]


@pytest.mark.parametrize("beam", [1, 4])
def test_one_sentences_candidates_ranked_in_python_come_in_the_arrays_order(beam: int) -> None:
    """``best_listed`` gives a sentence exactly ``best_candidates``' continuations in the same
    order: equal scores, dead beams and -inf log-probs included."""
    from service.engine.translation.ranking import best_candidates, best_listed

    rng = np.random.default_rng(beam)
    sentences, width = 3, 2 * beam
    logp = np.round(rng.normal(size=(sentences * beam, width)), 1).astype(np.float32)  # many ties
    logp[rng.random(logp.shape) < 0.1] = -np.inf
    logp = -np.sort(-logp, axis=1)  # each row's best first, as a TopK gives them
    tokens = rng.integers(0, 50, size=logp.shape)
    for scores in (
        np.round(rng.normal(size=sentences * beam), 1),
        np.tile([0.0] + [-np.inf] * (beam - 1), 3),
    ):
        rows, top_tokens, got = best_candidates(scores, logp, tokens, beam, 2 * beam)
        for j in range(sentences):
            want = zip(rows[j].tolist(), top_tokens[j].tolist(), got[j].tolist(), strict=True)
            assert best_listed(scores, logp, tokens, j * beam, beam) == list(want)


class CandidateScriptedDecoder(ScriptedDecoder):
    """The scripted decoder as a TopK graph would serve it: each row's n best tokens only."""

    def __init__(self, tables: Sequence[Table], n: int, default: dict[int, float] | None = None) -> None:
        super().__init__(tables, default)
        self.n = n

    def step(self, last_tokens: np.ndarray) -> tuple[Any, np.ndarray | None]:

        logp, attn = super().step(last_tokens)
        order = np.argsort(-logp, axis=1, kind="stable")[:, : self.n]
        return Candidates(np.take_along_axis(logp, order, 1), order.astype(np.int64)), attn


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_search_over_candidates_equals_the_full_log_probs(beam: int) -> None:
    tables: list[Table] = [
        {(): {A: 0.5, B: 0.4, EOS: 0.1}, (A,): {EOS: 0.2, B: 0.8}, (B,): {EOS: 0.9, A: 0.1}},
        {(): {B: 0.6, EOS: 0.4}},
        {},
    ]
    want, _ = search(tables, beam, max_len=[6, 3, 8], n_best=beam)
    dec = CandidateScriptedDecoder(tables, 2 * beam)
    got = beam_search(
        dec, len(tables), beam_size=beam, max_len=[6, 3, 8], bos_id=BOS, eos_id=EOS, n_best=beam
    )
    # Equal scores throughout; tokens too, except where tied tokens (the table's uniform
    # remainder) may come in either order.
    assert [[h.score for h in s] for s in got] == [[h.score for h in s] for s in want]
    assert [s[0].tokens for s in got] == [s[0].tokens for s in want]
    assert [s[0].alignment.tolist() for s in got if s[0].alignment is not None] == [
        s[0].alignment.tolist() for s in want if s[0].alignment is not None
    ]


def test_a_leaving_sentence_is_replaced_by_the_last_of_its_size_so_only_that_one_moves() -> None:
    """Four beam-2 sentences, the second leaves: the fourth takes its rows (one block copied by a
    slot decoder) and the third stays where it is; a block of another size shifts as before."""
    search = Search(bos_id=1, eos_id=2)
    a, b, c, d = (SentenceSearch(key, beam_size=2, max_len=5) for key in "abcd")
    for s in (a, b, c, d):
        search.extend([s])
    rows = search.remove(lambda s: s is b)
    assert search.sentences == [a, d, c]
    np.testing.assert_array_equal(rows, [0, 1, 6, 7, 4, 5])
    assert np.flatnonzero(rows != np.arange(len(rows))).tolist() == [2, 3]  # only d's rows change slot
    e = SentenceSearch("e", beam_size=3, max_len=5)
    search.extend([e])
    rows = search.remove(lambda s: s is a)  # c fills a's place; e (size 3) shifts down
    assert search.sentences == [c, d, e]
    np.testing.assert_array_equal(rows, [4, 5, 2, 3, 6, 7, 8])


def test_a_beam_stays_in_its_parents_row_and_only_extra_children_move() -> None:
    """One beam-4 sentence: the step's continuations come from rows 0, 0, 1, 0 (best first); the
    best child of each parent keeps its parent's row, the others take the free rows 2 and 3, so a
    slot decoder copies two histories, not three."""
    s = SentenceSearch("s", beam_size=4, max_len=9)
    s.scores = np.zeros(4)
    s.history = np.array([[A], [B], [C], [A]])
    s.steps = 1
    rows = s.advance([(0, A, -1.0), (0, B, -1.5), (1, A, -2.0), (0, C, -2.5)], None, EOS)
    assert rows is not None
    assert rows.tolist() == [0, 1, 0, 0]
    assert s.history.tolist() == [[A, A], [B, A], [A, B], [A, C]]
    assert s.scores.tolist() == [-1.0, -2.0, -1.5, -2.5]
    assert int((rows != np.arange(4)).sum()) == 2
