"""Glossary entries, their terms matched in a sentence, and do-not-translate placeholders."""

from __future__ import annotations

import time

import pytest

from service.glossaries.entries import Entry, GlossaryProblem, as_tsv, checked_entries, parse_entries
from service.glossaries.matching import TermMatcher
from service.glossaries.placeholders import PlaceholderLost, mask


def required(matcher: TermMatcher, sentence: str) -> tuple[str, ...]:
    """The target terms of the matches in ``sentence``, each once, in order of appearance (the
    phrases ``SentenceTerms.prepare`` requires)."""
    return tuple(dict.fromkeys(m.entry.target for m in matcher.matches(sentence)))


def test_a_term_matches_as_a_whole_word_and_with_its_case_by_default() -> None:
    matcher = TermMatcher([Entry("cart", "Warenkorb")])
    assert required(matcher, "Open the cart.") == ("Warenkorb",)
    assert required(matcher, "Open the Cart.") == ()  # case-sensitive
    assert required(matcher, "Open the carts.") == ()  # whole word
    assert required(matcher, "cart") == ("Warenkorb",)


def test_an_entry_may_match_in_any_case_and_inside_words() -> None:
    matcher = TermMatcher([Entry("cart", "Warenkorb", case_sensitive=False, whole_word=False)])
    assert required(matcher, "CARTS are full.") == ("Warenkorb",)
    assert [(m.start, m.end) for m in matcher.matches("a Cart and a cArt")] == [(2, 6), (13, 17)]


def test_the_longest_of_overlapping_matches_wins_and_the_others_that_fit_stay() -> None:
    matcher = TermMatcher(
        [
            Entry("new york", "NY"),
            Entry("york city", "York-Stadt"),
            Entry("city", "Stadt"),
            Entry("bus", "Bus"),
        ]
    )
    # "york city" (9) beats "new york" (8), though the latter starts earlier; "city" is inside it
    assert required(matcher, "the new york city bus") == ("York-Stadt", "Bus")
    assert required(matcher, "new york and a city") == ("NY", "Stadt")


def test_a_term_with_non_word_characters_is_matched_literally() -> None:
    matcher = TermMatcher([Entry("C++", "C++"), Entry("a.b", "x")])
    assert required(matcher, "I write C++ daily, not aXb.") == ("C++",)
    assert required(matcher, "see a.b") == ("x",)


def test_a_target_term_matched_twice_is_required_once() -> None:
    assert required(TermMatcher([Entry("dog", "Hund")]), "dog and dog") == ("Hund",)


def test_entries_are_stripped_and_checked() -> None:
    assert checked_entries([Entry(" cart ", " Warenkorb")], 10, 20) == (Entry("cart", "Warenkorb"),)
    with pytest.raises(GlossaryProblem, match="more than the 1") as e:
        checked_entries([Entry("a", "b"), Entry("c", "d")], 1, 20)
    assert e.value.limit == 1
    with pytest.raises(GlossaryProblem, match="longer than 3") as e:
        checked_entries([Entry("abcd", "b")], 10, 3)
    assert e.value.where == "entries[0].source"
    with pytest.raises(GlossaryProblem, match="empty"):
        checked_entries([Entry("a", "  ")], 10, 3)
    with pytest.raises(GlossaryProblem, match="line breaks"):
        checked_entries([Entry("a\nb", "c")], 10, 3)
    with pytest.raises(GlossaryProblem, match="more than once"):
        checked_entries(
            [Entry("Cart", "a", case_sensitive=False), Entry("cart", "b", case_sensitive=False)], 10, 9
        )
    with pytest.raises(GlossaryProblem, match="at least one"):
        checked_entries([], 10, 3)


def test_tsv_and_csv_entries_parse_and_tsv_is_written_back() -> None:
    entries = parse_entries("cart\tWarenkorb\n\nsign in\tAnmelden\n", "tsv")
    assert entries == [Entry("cart", "Warenkorb"), Entry("sign in", "Anmelden")]
    assert as_tsv(entries) == "cart\tWarenkorb\nsign in\tAnmelden"
    assert parse_entries('"a, b",c\r\nd,e,en,de\n', "csv") == [Entry("a, b", "c"), Entry("d", "e")]


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [("cart Warenkorb", "tsv", "line 1"), ("a\tb\nc\td\te", "tsv", "line 2"), ('a,"b', "csv", "CSV")],
)
def test_malformed_entries_name_their_line(text: str, fmt: str, message: str) -> None:
    with pytest.raises(GlossaryProblem, match=message):
        parse_entries(text, fmt)  # type: ignore[arg-type]


def test_kept_spans_are_masked_and_restored_byte_for_byte() -> None:
    masked = mask("You have {count} items in ACME Cloud, {count}!", ["{count}", "ACME Cloud", "absent"])
    assert masked.text == "You have @2@ items in @1@, @2@!"  # the longer span numbered first
    assert masked.placeholders == ("@2@", "@1@")
    assert (
        masked.restore("Sie haben @2@ Artikel in @1@, @2@!")
        == "Sie haben {count} Artikel in ACME Cloud, {count}!"
    )


def test_a_placeholder_never_stands_for_text_the_sentence_had() -> None:
    masked = mask("Mail me@1@ about {price}", ["{price}"])
    assert masked.text == "Mail me@1@ about %1%"
    assert masked.restore("Schreib me@1@ wegen %1%") == "Schreib me@1@ wegen {price}"


def test_spans_of_any_characters_come_back_unchanged() -> None:
    span = "<b>\u00a0é\U0001f600\\1 $&</b>"
    masked = mask(f"x {span} y", [span])
    assert masked.restore(masked.text.replace("x", "X")) == f"X {span} y"


def test_a_lost_placeholder_is_an_error_not_a_silent_loss() -> None:
    masked = mask("keep {this}", ["{this}"])
    with pytest.raises(PlaceholderLost):
        masked.restore("nothing kept")


def test_without_spans_nothing_changes() -> None:
    masked = mask("plain text", [])
    assert (masked.text, masked.kept, masked.restore("x")) == ("plain text", (), "x")


def test_whole_words_hold_for_letters_digits_and_underscores_in_any_script() -> None:
    matcher = TermMatcher([Entry("Straße", "street"), Entry("+1", "plus one")])
    assert required(matcher, "die Straße.") == ("street",)
    assert required(matcher, "die Straßen") == ()
    assert required(matcher, "x_Straße") == ()
    assert required(matcher, "a+1") == ("plus one",)  # no word character on both sides of a boundary


def test_case_insensitive_terms_keep_the_sentences_offsets() -> None:
    matcher = TermMatcher([Entry("istanbul", "İstanbul", case_sensitive=False)])
    found = matcher.matches("İ in ISTANBUL")
    assert [(m.start, m.end) for m in found] == [(5, 13)]


def test_ten_thousand_entries_match_a_sentence_in_milliseconds() -> None:
    entries = [Entry(f"term{i}", f"Begriff{i}", case_sensitive=i % 2 == 0) for i in range(10_000)]
    matcher = TermMatcher(entries)
    sentence = " ".join(f"term{i}" for i in range(0, 10_000, 500))
    started = time.perf_counter()
    terms = required(matcher, sentence)
    assert time.perf_counter() - started < 0.05  # ~0.3 ms; a regular expression of all took seconds
    assert terms == tuple(f"Begriff{i}" for i in range(0, 10_000, 500))


def test_each_required_phrase_comes_with_its_first_span_in_the_masked_sentence() -> None:
    """What the engine places by alignment: a kept span's placeholder where it stands, a term
    where its source term matched (its first match), each phrase once."""
    from service.serving.terminology import SentenceTerms

    terms = SentenceTerms(TermMatcher([Entry("cart", "Warenkorb")]), keep=("{n}",))
    masked, required = terms.prepare("Add {n} items to the cart, then the cart.")
    assert masked.text == "Add @1@ items to the cart, then the cart."
    assert required == (("@1@", (4, 7)), ("Warenkorb", (21, 25)))
    assert [masked.text[a:b] for _, (a, b) in required] == ["@1@", "cart"]
