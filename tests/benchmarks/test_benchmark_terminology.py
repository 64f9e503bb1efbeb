"""The terminology test set: a Dice dictionary from training pairs, terms picked per sentence."""

from __future__ import annotations

import gzip
from pathlib import Path

from benchmarks.terminology import (
    TermSentence,
    bolted_on,
    german_nouns,
    has_term,
    learn_dictionary,
    source_span,
    term_accuracy,
    term_sentences,
    terminology_set,
    unseen_terms,
    with_terms,
)

TRAIN = [
    ("a black horse runs", "ein schwarzes Pferd rennt"),
    ("the horse eats grass", "das Pferd frisst Gras"),
    ("a horse and a dog", "ein Pferd und ein Hund"),
    ("the dog runs home", "der Hund rennt heim"),
    ("a dog eats grass", "ein Hund frisst Gras"),
] * 2


def test_the_dictionary_keeps_mutual_best_pairs_above_the_threshold() -> None:
    sources, targets = zip(*TRAIN, strict=True)
    dictionary = learn_dictionary(sources, targets, min_count=2, min_dice=0.5)
    assert dictionary["horse"] == "pferd" and dictionary["grass"] == "gras" and dictionary["runs"] == "rennt"
    assert "a" not in dictionary  # shorter than MIN_LETTERS
    assert all(dictionary[s] != dictionary[o] for s in dictionary for o in dictionary if s != o)  # mutual


def test_a_sentence_takes_the_pairs_its_source_and_reference_both_use_as_written() -> None:
    dictionary = {"horse": "pferd", "grass": "gras", "dog": "hund"}
    sentences = term_sentences(
        ["The horse eats grass.", "A cat sleeps.", "A dog sees a horse."],
        ["Das Pferd frisst Gras.", "Eine Katze schläft.", "Ein Hund sieht eine Stute."],
        dictionary,
    )
    assert [s.terms for s in sentences] == [(("horse", "Pferd"), ("grass", "Gras")), (("dog", "Hund"),)]
    assert term_accuracy(["Ein Pferd frisst Heu.", "Der Hund sieht ein Pferd."], sentences) == 2 / 3
    assert term_sentences(["The horse eats grass."] * 3, ["Das Pferd frisst Gras."] * 3, dictionary, 2)[
        1:
    ] == [sentences[0]]


def test_the_set_is_built_from_train_and_the_test_split_only(tmp_path: Path) -> None:
    m30k = tmp_path / "multi30k"
    m30k.mkdir()
    test = [("the horse eats grass", "das Pferd frisst Gras"), ("a bird sings", "ein Vogel singt")]
    for split, pairs in (("train", TRAIN * 3), ("test_2016_flickr", test)):
        for i, lang in enumerate(("en", "de")):
            with gzip.open(m30k / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(p[i] for p in pairs) + "\n")
    dictionary, sentences = terminology_set(tmp_path, "en", "de")
    assert dictionary["horse"] == "pferd"
    assert [s.source for s in sentences] == ["the horse eats grass"]
    assert ("horse", "Pferd") in sentences[0].terms


def test_a_term_counts_as_a_word_exactly_as_written() -> None:
    assert has_term("A man rides a four-wheeler.", "four") and has_term("Four men.", "Four")
    assert not has_term("fourteen men", "four") and not has_term("Four men.", "four")
    assert not has_term("the dogs", "dog") and has_term("the dog.", "dog")


def test_the_unseen_set_gives_each_noun_term_a_compound_no_training_target_holds() -> None:
    train_de = ["Ein Hund und ein Ball.", "Der Hund spielt.", "Ein Edelhund rennt.", "Sie spielt gern."]
    train_en = ["A dog and a ball.", "The dog plays.", "A noble dog runs.", "She likes to play."]
    assert german_nouns(train_de) == {"hund", "ball", "edelhund"}  # "Ein"/"Sie" start a sentence
    sentences = [
        TermSentence(
            "A dog plays with a ball.",
            "Ein Hund spielt mit einem Ball.",
            (("dog", "Hund"), ("plays", "spielt")),
        ),
        TermSentence("She plays.", "Sie spielt.", (("plays", "spielt"),)),
    ]
    (unseen,) = unseen_terms(sentences, (train_en, train_de), ("en", "de"))
    assert unseen.terms == (("dog", "Prachthund"),)  # "Edelhund" is a training word; verbs are left out
    assert unseen.seen == ("Hund",)
    assert with_terms("Zwei Hunde sehen einen Hund.", unseen) == "Zwei Hunde sehen einen Prachthund."
    (english,) = unseen_terms(
        [TermSentence("Ein Hund.", "A dog.", (("Hund", "dog"),))], (train_de, train_en), ("de", "en")
    )
    assert english.terms == (("Hund", "megadog"),)


def test_a_term_is_bolted_on_after_the_sentence_or_as_a_sentence_of_its_own() -> None:
    free = "Zwei Hunde spielen im Schnee."
    assert not bolted_on("Zwei Köter spielen im Schnee.", free, ["Köter"])
    assert bolted_on("Zwei Hunde spielen im Schnee. Köter.", free, ["Köter"])
    assert bolted_on("Zwei Hunde spielen im Schnee. Köter", free, ["Köter"])
    assert not bolted_on("Köter. Sie spielen.", "Hunde. Sie spielen.", ["Köter"])
    assert source_span("A dog and dogs.", "dogs") == (10, 14) and source_span("doggy", "dog") is None
