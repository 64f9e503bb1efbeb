"""Required phrases: spellings in a target vocabulary and the per-hypothesis state
(service/engine/translation/constraints.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from service.engine.translation.constraints import (
    Constraints,
    ConstraintUnsatisfiable,
    PhraseSpeller,
    phrase_token_ids,
)
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis

CORPUS = ["der Warenkorb ist voll", "ein Haus mit Tür", "Warenkorb und Haustür"] * 20


@pytest.fixture(scope="module")
def metaspace() -> Tokenizer:
    """A SentencePiece-style BPE (▁ marks word starts), like the exported models'."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """A byte-level BPE (GPT-2 style), which spells a word after a space apart from at the start."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def test_a_phrase_is_spelled_as_inside_a_sentence(metaspace: Tokenizer) -> None:
    (spelling,) = phrase_token_ids(metaspace, "Warenkorb")
    inside = metaspace.encode("der Warenkorb ist voll", add_special_tokens=False).ids
    assert any(tuple(inside[i : i + len(spelling)]) == spelling for i in range(len(inside)))
    assert metaspace.decode(list(spelling)) == "Warenkorb"


def test_a_byte_level_phrase_has_its_sentence_initial_spelling_too(byte_level: Tokenizer) -> None:
    spellings = phrase_token_ids(byte_level, "Warenkorb")
    assert len(spellings) == 2
    assert {byte_level.decode(list(s)).strip() for s in spellings} == {"Warenkorb"}
    assert tuple(byte_level.encode("Warenkorb").ids) in spellings


@pytest.mark.parametrize("phrase", ["中文", "{x}", "", "  "])
def test_a_phrase_the_vocabulary_cannot_spell_is_unsatisfiable(metaspace: Tokenizer, phrase: str) -> None:
    with pytest.raises(ConstraintUnsatisfiable, match="required phrase"):
        phrase_token_ids(metaspace, phrase)


def test_a_phrase_may_end_in_its_last_piece_merged_with_punctuation() -> None:
    """A vocabulary with "▁Schnee." spells "Schnee" at the end of a sentence that way."""
    vocab = {"<unk>": 0, "▁Schnee": 1, "▁Schnee.": 2, "▁Schnee-": 3, "▁Schneemann": 4, "▁im": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    speller = PhraseSpeller(tok)
    assert set(speller._spell("Schnee")) == {(1,), (2,), (3,)}
    assert set(speller._spell("im Schnee")) == {(5, 1), (5, 2), (5, 3)}


def test_phrases_are_met_in_any_order_each_once() -> None:
    c = Constraints([[(5, 6)], [(7,)]])
    state = c.start
    assert (c.needed(state), c.progress(state), set(c.next_tokens(state))) == (3, 0, {5, 7})
    state = c.advance(state, 7)
    assert (c.needed(state), c.progress(state), set(c.next_tokens(state))) == (2, 1, {5})
    state = c.advance(state, 7)  # met already: no progress
    assert c.progress(state) == 1
    state = c.advance(c.advance(state, 5), 6)
    assert c.done(state) and c.needed(state) == 0 and c.progress(state) == 3


def test_a_phrase_once_started_is_continued_or_abandoned() -> None:
    c = Constraints([[(5, 6, 7)], [(8,)]])
    state = c.advance(c.start, 5)
    assert (set(c.next_tokens(state)), c.needed(state), c.progress(state)) == ({6}, 3, 1)
    abandoned = c.advance(state, 9)
    assert abandoned == c.start
    restarted = c.advance(state, 5)  # not its next token, but it starts the phrase again
    assert c.progress(restarted) == 1
    other = c.advance(state, 8)  # abandons the first, meets the second
    assert other.met == {1} and c.needed(other) == 3


def test_the_shortest_spelling_counts_for_what_is_needed() -> None:
    c = Constraints([[(5, 6, 7), (4,)], [(8, 9)]])
    assert c.needed(c.start) == 3
    long = c.advance(c.start, 5)
    assert c.needed(long) == 4  # two more of the long spelling and the other phrase
    assert c.done(c.advance(c.advance(c.advance(c.start, 8), 9), 4))


def test_phrases_that_share_a_beginning() -> None:
    c = Constraints([[(5,)], [(5, 6)]])
    state = c.advance(c.start, 5)
    assert state.met == {0} and set(c.next_tokens(state)) == {6}
    assert c.done(c.advance(state, 6))


# --- the search over a scripted decoder -----------------------------------------------------------

BOS, EOS, V = 1, 2, 12  # tokens 3 … 11 are words


class RandomDecoder:
    """Log-probs that depend only on a row's sentence and generated prefix (a fixed random
    function of both), with </s> likely after a few tokens; it keeps its rows' prefixes and
    permutes them on ``reorder`` as a key/value cache would."""

    def __init__(self, sentences: int, seed: int = 0) -> None:
        self.seed = seed
        self.rows: list[tuple[int, tuple[int, ...]]] = [(i, ()) for i in range(sentences)]

    def log_probs(self, sentence: int, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, sentence, *prefix])
        logits = rng.normal(size=V) * 2
        logits[[0, BOS]] = -30.0
        logits[EOS] += len(prefix) - 4
        return (logits - np.logaddexp.reduce(logits)).astype(np.float32)

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, None]:
        self.rows = [
            (s, (*p, int(t)) if t != BOS else p) for (s, p), t in zip(self.rows, last_tokens, strict=True)
        ]
        return np.stack([self.log_probs(s, p) for s, p in self.rows]), None

    def reorder(self, rows: np.ndarray) -> None:
        self.rows = [self.rows[r] for r in rows]


def search(
    constraints: list[Constraints | None], beam: int, max_len: int = 12, seed: int = 0
) -> list[list[TokenHypothesis]]:
    return beam_search(
        RandomDecoder(len(constraints), seed),
        len(constraints),
        beam_size=beam,
        n_best=beam,
        max_len=max_len,
        bos_id=BOS,
        eos_id=EOS,
        constraints=constraints,
    )


def contains(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(phrase)]) == phrase for i in range(len(tokens)))


def random_constraints(n: int, seed: int) -> list[Constraints | None]:
    rng = random.Random(seed)
    phrase = lambda: tuple(rng.randrange(3, V) for _ in range(rng.randint(1, 3)))  # noqa: E731
    return [Constraints([[phrase()] for _ in range(rng.randint(1, 2))]) for _ in range(n)]


@pytest.mark.parametrize("beam", [1, 4])
def test_every_hypothesis_holds_every_phrase_and_scores_its_log_prob(beam: int) -> None:
    constraints = random_constraints(40, seed=beam)
    decoder = RandomDecoder(0)
    for i, (c, found) in enumerate(zip(constraints, search(constraints, beam), strict=True)):
        assert c is not None and len(found) == beam
        for h in found:
            assert all(contains(h.tokens, spellings[0]) for spellings in c.phrases), (c.phrases, h.tokens)
            assert len(h.tokens) <= 12
            ended = [*h.tokens, EOS] if len(h.tokens) < 12 else h.tokens
            logp = sum(float(decoder.log_probs(i, tuple(ended[:j]))[t]) for j, t in enumerate(ended))
            assert h.score == pytest.approx(logp / len(ended), rel=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_free_sentences_search_as_without_constrained_ones_beside_them(beam: int) -> None:
    constrained = random_constraints(6, seed=10 + beam)
    mixed = [c if i % 2 else None for i, c in enumerate(constrained)]
    together = search(mixed, beam)
    nothing: list[Constraints | None] = [None] * len(mixed)
    free = search(nothing, beam)
    for i, c in enumerate(mixed):
        alone = search([*nothing[:i], c], beam)[i]  # the same sentence index: the same scripted model
        assert [(h.tokens, h.score) for h in together[i]] == [(h.tokens, h.score) for h in alone]
        if c is None:
            assert [(h.tokens, h.score) for h in together[i]] == [(h.tokens, h.score) for h in free[i]]


def test_phrases_that_fill_the_limit_are_the_whole_output() -> None:
    c = Constraints([[(5, 6)], [(7,)]])
    (found,) = search([c], beam=3, max_len=3)
    assert found and all(sorted(h.tokens) == [5, 6, 7] for h in found)
    assert {tuple(h.tokens) for h in found} <= {(5, 6, 7), (7, 5, 6)}


def test_a_forced_first_token_counts_in_the_limit_not_in_the_phrases() -> None:
    c = Constraints([[(5, 6)]])
    found = beam_search(
        RandomDecoder(1), 1, beam_size=2, max_len=3, bos_id=BOS, eos_id=EOS, forced_first=9, constraints=[c]
    )[0]
    assert found and all(h.tokens == [5, 6] for h in found)


@pytest.mark.parametrize("beam", [1, 4])
def test_no_piece_glues_itself_to_a_phrase_just_met(beam: int) -> None:
    """A met phrase stays a word of its own ("Drahtesel", never "Drahteselten"): the tokens that
    continue a word may not follow it, and it counts as met all the same."""
    gluing = frozenset(range(3, V)) - {4}  # every word token continues a word but 4 (a word start)
    for seed in range(8):
        c = Constraints([[(5,)]], continuing=gluing)
        (found,) = search([c], beam, seed=seed)
        for h in found:
            at = h.tokens.index(5)
            assert at == len(h.tokens) - 1 or h.tokens[at + 1] not in gluing, h.tokens
    c = Constraints([[(5,)]], continuing=gluing)
    met = c.advance(c.start, 5)
    assert met.just_met and not c.allows(met, 6) and c.allows(met, 4) and c.allows(c.start, 6)
    assert not c.advance(met, 4).just_met and c.done(c.advance(met, 4))


def test_a_result_holds_its_phrases_as_the_constrained_search_would_have_them() -> None:
    c = Constraints([[(5, 6)], [(7,)]], continuing=frozenset({8}))
    assert c.holds([1, 7, 2, 5, 6, 3]) and c.holds([5, 6, 7])
    assert not c.holds([5, 2, 6, 7])  # a phrase broken off counts for nothing
    assert not c.holds([5, 6, 3])  # one phrase missing
    assert not c.holds([5, 6, 8, 7])  # a piece glued to a phrase just met


def test_a_search_whose_every_continuation_is_barred_ends_with_the_rows_that_hold_every_phrase() -> None:
    """The phrase met, its word may not go on, and </s> is not among the candidates: the row that
    holds it ends as it stands, as at the length limit, rather than the sentence getting nothing."""
    eos, phrase, gluing = 1, 5, 7
    search = SentenceSearch(
        0, beam_size=2, max_len=10, constraints=Constraints([[(phrase,)]], continuing=frozenset({gluing}))
    )
    search.advance([(0, phrase, -0.5)], None, eos)
    assert search.advance([(0, gluing, -0.6), (1, gluing, -0.7)], None, eos) is None
    assert search.done and [h.tokens for h in search.results()] == [[phrase]]
    assert search.results()[0].score == pytest.approx(-0.5)
