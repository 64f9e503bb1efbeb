"""beam_step.py: every free sentence of a step advanced as arrays gives, token for token and score
for score, what each sentence's own ``SentenceSearch`` gives (the per-sentence reference)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from service.engine.translation import beam_step, search
from service.engine.translation.candidates import Candidates
from service.engine.translation.search import Search
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis

V, BOS, EOS = 12, 1, 2


class HashedDecoder:
    """Log-probs of a row from a hash of (its sentence, the tokens it was fed): a real decoder's
    dependence on its own history, with ties, -inf tokens and </s> growing likelier with length;
    full log-probs or each row's best ``candidates`` tokens."""

    def __init__(self, seed: int, candidates: int | None) -> None:
        self.seed, self.candidates = seed, candidates
        self.rows: list[tuple[int, tuple[int, ...]]] = []

    def join(self, keys: list[int]) -> None:
        self.rows += [(key, ()) for key in keys]

    def log_probs(self, key: int, fed: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, key, *fed])
        x = rng.normal(size=V) * 2
        x[BOS] = -50
        x[EOS] += 0.3 * len(fed) - 1.0
        if rng.random() < 0.3:
            x[rng.integers(V)] = -np.inf
        if rng.random() < 0.2:
            x[3] = x[4]
        return (x - np.logaddexp.reduce(x[np.isfinite(x)])).astype(np.float32)

    def step(self, last: np.ndarray) -> tuple[Any, np.ndarray]:
        self.rows = [(key, (*fed, int(t))) for (key, fed), t in zip(self.rows, last, strict=True)]
        logp = np.stack([self.log_probs(key, fed) for key, fed in self.rows])
        attention = np.array([[len(fed), fed[-1], 0.5] for _, fed in self.rows], dtype=np.float32)
        if self.candidates is None:
            return logp, attention
        order = np.argsort(-logp, axis=1, kind="stable")[:, : self.candidates]
        return Candidates(np.take_along_axis(logp, order, 1), order.astype(np.int64)), attention

    def reorder(self, rows: np.ndarray) -> None:
        self.rows = [self.rows[r] for r in rows]


def found(hyps: list[TokenHypothesis]) -> list[tuple[list[int], float, Any, Any]]:
    return [
        (
            h.tokens,
            h.score,
            None if h.alignment is None else h.alignment.tolist(),
            None if h.token_log_probs is None else h.token_log_probs.tolist(),
        )
        for h in hyps
    ]


def whole_batch_case(seed: int) -> list[list[tuple[list[int], float, Any]]]:
    r = random.Random(seed)
    n, beam = r.randint(3, 7), r.choice([1, 2, 3, 4, 5])
    decoder = HashedDecoder(seed, r.choice([None, 2 * beam, V]))
    decoder.join(list(range(n)))
    gone_after = r.randint(0, 6) if r.random() < 0.3 else None
    calls = [0]

    def abandoned() -> list[bool]:
        calls[0] += 1
        return [gone_after is not None and calls[0] > gone_after and i % 2 == 0 for i in range(n)]

    hyps = beam_search(
        decoder,
        n,
        beam_size=beam,
        max_len=[r.randint(1, 9) for _ in range(n)] if r.random() < 0.5 else r.randint(1, 9),
        bos_id=BOS,
        eos_id=EOS,
        n_best=r.randint(1, beam),
        length_penalty=r.choice([1.0, 0.6, 1.3, 0.0, -0.5]),
        early_stopping=r.choice([True, False, "never"]),
        forced_first=r.choice([None, 7]),
        abandoned=abandoned,
        alignments=r.random() < 0.3,
    )
    return [found(h) for h in hyps]


def joining_case(seed: int) -> dict[int, Any]:
    """Sentences of mixed options, a third keeping alignments, joining between steps; now and
    then the first running one is taken out."""
    r, leaving = random.Random(seed), random.Random(seed + 1)
    plan = []
    for key in range(r.randint(3, 10)):
        beam = r.choice([1, 2, 4])
        options = dict(
            beam_size=beam,
            max_len=r.randint(1, 9),
            n_best=r.randint(1, beam),
            length_penalty=r.choice([1.0, 0.6]),
            early_stopping=r.choice([True, False, "never"]),
            forced_first=r.choice([None, 7]),
            with_attention=r.random() < 0.3,
            source_len=3,
        )
        plan.append((r.randint(0, 6), key, options))
    s, decoder, results, step = Search(BOS, EOS), HashedDecoder(seed, r.choice([None, 8, V])), {}, 0
    while plan or s.sentences:
        joining = [SentenceSearch(key, **o) for at, key, o in plan if at <= step]  # type: ignore[arg-type]
        plan = [p for p in plan if p[0] > step]
        s.extend([x for x in joining if not x.done])
        decoder.join([x.key for x in joining if not x.done for _ in range(x.k)])
        results.update((x.key, found(x.results())) for x in joining if x.done)
        if leaving.random() < 0.1 and s.sentences and step > 2:
            first = s.sentences[0].key
            decoder.reorder(s.remove(lambda x: x.key == first))  # noqa: B023 (called at once)
            results[first] = "gone"
        step += 1
        if s.sentences:
            rows, finished = s.advance(*decoder.step(s.last_tokens()))
            decoder.reorder(rows)
            results.update((x.key, found(x.results())) for x in finished)
    return results


@pytest.mark.parametrize("case", [whole_batch_case, joining_case])
def test_arrays_and_own_searches_agree_token_for_token(case: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stepped = []
    real_step = beam_step.step
    monkeypatch.setattr(beam_step, "step", lambda *a: stepped.append(len(a[0].steps)) or real_step(*a))
    as_arrays = {seed: case(seed) for seed in range(120)}
    assert sum(stepped) > 1000  # sentence-steps taken as arrays
    monkeypatch.setattr(search, "steps_in_batch", lambda s: False)  # each through its own search
    stepped.clear()
    own = {seed: case(seed) for seed in range(120)}
    assert not stepped
    assert as_arrays == own


def test_a_few_sentences_step_through_their_own_searches() -> None:
    """Below ``FEW_SENTENCES`` NumPy's cost per call outweighs the loop it saves."""
    for n, free in ((search.FEW_SENTENCES, False), (search.FEW_SENTENCES + 1, True)):
        s = Search(BOS, EOS)
        s.extend([SentenceSearch(i, beam_size=4, max_len=5, with_attention=False) for i in range(n)])
        assert s._all_free is free


@pytest.mark.parametrize("k", [2, 3, 4, 8, beam_step.WIDEST_BEAM])
def test_children_take_rows_as_one_sentences_own_search_places_them(k: int) -> None:
    """``beam_step.in_place`` over many sentences places each child in the row
    ``ranking.in_place`` gives it in that sentence's own search, parents repeated or not."""
    from service.engine.translation.ranking import in_place

    rng = np.random.default_rng(k)
    n = 50
    parents = rng.integers(0, rng.integers(1, k + 1, size=(n, 1)), size=(n, k))  # few parents or many
    tokens, scores = rng.integers(0, 1000, size=(n, k)), rng.normal(size=(n, k))
    placed = beam_step.in_place(parents, tokens, scores, np.arange(n)[:, None])
    for i in range(n):
        own = in_place(list(zip(parents[i].tolist(), tokens[i].tolist(), scores[i].tolist(), strict=True)))
        assert list(zip(*(x[i].tolist() for x in placed), strict=True)) == own
