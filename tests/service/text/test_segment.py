"""Sentence segmentation: sentences found, layout kept exactly, long sentences cut to fit."""

from __future__ import annotations

import pytest

from service.text.segment import segment, split_long

PARAGRAPH = (
    "A man is riding a bicycle down the street. Two dogs are playing in the snow. "
    "A woman is reading a book in a park while children play around her."
)

LAYOUTS = [
    PARAGRAPH,
    "  Leading and trailing space.  \n",
    "Line one.\nLine two.\n\nAfter a blank line.\r\nWindows line.\rOld Mac line.",
    "Shopping:\n- Buy milk.\n- Walk the dog\n* Call mom\n• Send the letter\n1. First\n2) Second\na) Third",
    "\n\n\n",
    "Tabs\there.\tAnd there.",
    "One sentence without a full stop",
    "Emoji 😀 in a sentence. 👍 Next one! Über Straße.",
]


@pytest.mark.parametrize("text", LAYOUTS)
def test_join_of_the_sentences_themselves_is_the_text(text: str) -> None:
    s = segment(text, "en")
    assert s.join(s.sentences) == text
    assert len(s.gaps) == len(s.sentences) + 1
    for sentence, (start, end) in zip(s.sentences, s.spans, strict=True):
        assert text[start:end] == sentence
        assert sentence == sentence.strip() and sentence


def test_the_paragraph_is_three_sentences() -> None:
    assert segment(PARAGRAPH, "en").sentences == [
        "A man is riding a bicycle down the street.",
        "Two dogs are playing in the snow.",
        "A woman is reading a book in a park while children play around her.",
    ]


def test_translations_take_the_place_of_the_sentences() -> None:
    text = "  One. Two!\n\n- Three?\n"
    s = segment(text, "en")
    assert s.join([x.upper() for x in s.sentences]) == "  ONE. TWO!\n\n- THREE?\n"


def test_list_items_stay_one_per_line_with_their_markers_untranslated() -> None:
    s = segment("Items:\n- Buy milk\n- Walk the dog\n1. Call mom", "en")
    assert s.sentences == ["Items:", "Buy milk", "Walk the dog", "Call mom"]
    assert s.gaps == ["", "\n- ", "\n- ", "\n1. ", ""]


@pytest.mark.parametrize(
    ("text", "language", "n"),
    [
        ("Dr. Smith met Mr. Jones at 5 p.m. on Main St. yesterday. They talked.", "en", 2),
        ("The price rose 3.5% to $12.40 in 2023. Version 2.0 ships soon.", "en", 2),
        ("See https://example.com/a.b?c=d for details. Mail john.doe@example.org now.", "en", 2),
        ("Herr Dr. Müller kam am 3. Mai um 10 Uhr. Er sagte z.B. nichts.", "de", 2),
        ('He said, "Stop here." Then he left.', "en", 2),
    ],
)
def test_abbreviations_numbers_urls_and_quotes_do_not_end_sentences(text: str, language: str, n: int) -> None:
    assert len(segment(text, language).sentences) == n


def test_a_regional_language_code_uses_its_language() -> None:
    assert segment("Herr Dr. Müller kam am 3. Mai. Gut.", "de-AT").sentences == [
        "Herr Dr. Müller kam am 3. Mai.",
        "Gut.",
    ]


def test_join_checks_the_count() -> None:
    with pytest.raises(ValueError, match="2 translations for 3 sentences"):
        segment(PARAGRAPH, "en").join(["a", "b"])


def words(text: str) -> int:
    return len(text.split()) + 1  # like a tokenizer with an end-of-sequence token


def test_a_sentence_that_fits_is_one_piece() -> None:
    assert split_long("Short one.", words, 10) == [("Short one.", "")]


def test_long_sentences_are_cut_at_clause_punctuation_first() -> None:
    sentence = "one two three four, five six seven eight; nine ten eleven twelve"
    pieces = split_long(sentence, words, 6)
    assert [p for p, _ in pieces] == [
        "one two three four,",
        "five six seven eight;",
        "nine ten eleven twelve",
    ]
    assert "".join(p + s for p, s in pieces) == sentence


def test_without_punctuation_at_spaces_and_every_piece_fits() -> None:
    sentence = " ".join(f"w{i}" for i in range(100))
    pieces = split_long(sentence, words, 8)
    assert all(words(p) <= 8 for p, _ in pieces)
    assert "".join(p + s for p, s in pieces) == sentence


def test_without_spaces_at_the_longest_prefix_that_fits() -> None:
    def chars(text: str) -> int:
        return len(text) // 4 + 1

    sentence = "x" * 50
    pieces = split_long(sentence, chars, 4)
    assert all(chars(p) <= 4 for p, _ in pieces)
    assert "".join(p + s for p, s in pieces) == sentence
    assert [len(p) for p, _ in pieces] == [15, 15, 15, 5]
