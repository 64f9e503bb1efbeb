"""Required phrases: spellings in a target vocabulary and the per-hypothesis state
(service/engine/constraints.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from service.engine.constraints import Constraints, ConstraintUnsatisfiable, phrase_token_ids

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
