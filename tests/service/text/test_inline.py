"""Inline elements placed on a translation by its alignment (service/text/inline.py), and HTML's
runs that only inline elements separate read as one text (service/text/inline_html.py)."""

from __future__ import annotations

from service.text.html import parse_html
from service.text.inline import Element, fill, place
from service.text.inline_html import MAX_DEPTH, Block, inline_html

SOURCE = "Two dogs are playing in the snow."
SOURCE_TOKENS = ["▁Two", "▁dogs", "▁are", "▁playing", "▁in", "▁the", "▁snow.", "</s>"]
TARGET = "Zwei Hunde spielen im Schnee."
TARGET_TOKENS = ["▁Zwei", "▁Hunde", "▁spielen", "▁im", "▁Schnee."]
# the default en-de model's cross-attention for this pair, rounded
ALIGNMENT = [
    [0.94, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [0.01, 0.95, 0.02, 0.01, 0.0, 0.0, 0.0, 0.01],
    [0.0, 0.01, 0.06, 0.9, 0.01, 0.0, 0.0, 0.02],
    [0.01, 0.01, 0.01, 0.16, 0.53, 0.09, 0.03, 0.16],
    [0.0, 0.0, 0.01, 0.01, 0.02, 0.07, 0.76, 0.13],
]


def _placed(*elements: Element) -> list[str]:
    ranges = place(SOURCE, elements, SOURCE_TOKENS, TARGET, TARGET_TOKENS, ALIGNMENT)
    return [TARGET[start:end] for start, end in ranges]


def test_an_element_goes_around_the_words_aligned_to_its_own() -> None:
    assert _placed(Element(13, 20, -1)) == ["spielen"]  # "playing"
    assert _placed(Element(28, 32, -1)) == ["Schnee"]  # "snow": the period stays outside
    assert _placed(Element(28, 33, -1)) == ["Schnee."]  # "snow.": it had one


def test_nesting_and_order_are_kept() -> None:
    # <b>dogs <i>are playing</i></b>: the child inside its parent's range
    assert _placed(Element(4, 20, -1), Element(9, 20, 0)) == ["Hunde spielen", "spielen"]
    # an element over all of its parent's words takes all of its parent's range
    assert _placed(Element(0, 33, -1), Element(0, 33, 0)) == [TARGET, TARGET]


def test_an_element_that_aligns_to_nothing_stays_beside_its_neighbours() -> None:
    ranges = place(SOURCE, [Element(9, 12, -1)], SOURCE_TOKENS, TARGET, TARGET_TOKENS, [[0.0] * 8] * 5)
    assert ranges == [(0, 0)]  # kept, empty: the caller writes its tags there
    ranges = place(
        SOURCE, [Element(0, 3, -1), Element(9, 12, -1)], SOURCE_TOKENS, TARGET, TARGET_TOKENS, ALIGNMENT
    )
    assert ranges[1][0] >= ranges[0][1]


def test_fill_gives_every_character_to_a_run_the_longest_taking_the_gaps() -> None:
    # runs "Two dogs are " | "playing" | " in the snow."
    runs = [Element(0, 13, -1), Element(13, 20, -1), Element(20, 33, -1)]
    spans = place(SOURCE, runs, SOURCE_TOKENS, TARGET, TARGET_TOKENS, ALIGNMENT)
    parts = [TARGET[a:b] for a, b in fill(spans, [13, 7, 13], len(TARGET))]
    assert "".join(parts) == TARGET
    assert parts[1] == "spielen"
    # a run that aligns to nothing stays, empty, in its place
    assert fill([(0, 4), (4, 4), (5, 10)], [4, 1, 5], 10) == [(0, 4), (4, 4), (4, 10)]


def _units(document: str) -> list[Block | int]:
    return inline_html(parse_html(document)).units


def test_runs_that_only_inline_elements_separate_are_one_block_with_their_tags() -> None:
    html = '<p><a href="/x?a=1&amp;b" class=l>Two</a> dogs are <b>playing</b>.</p>'
    (block,) = _units(html)
    assert isinstance(block, Block)
    assert block.text == "Two dogs are playing."
    assert [(e.start, e.end) for e in block.elements] == [(0, 3), (13, 20)]
    assert block.tags == [('<a href="/x?a=1&amp;b" class=l>', "</a>"), ("<b>", "</b>")]
    layout = inline_html(parse_html(html))
    rendered = block.render("Zwei Hunde spielen.", [(0, 4), (11, 18)], [0, 1])
    assert layout.render([rendered]) == '<p><a href="/x?a=1&amp;b" class=l>Zwei</a> Hunde <b>spielen</b>.</p>'


def test_block_elements_and_other_tags_end_a_block() -> None:
    units = _units("<p>One <br> two <code>x</code> three</p><p>four <img alt='a cat'> five</p>")
    assert [u.text if isinstance(u, Block) else u for u in units] == [
        "One",
        "two",
        "three",
        "four",
        4,
        "five",
    ]


def test_markup_that_does_not_nest_or_nests_too_deep_is_read_as_before() -> None:
    for html in (
        "<p>Two <b>dogs <i>are</b> playing</i> here.</p>",
        "<p>Two dogs <b>are playing in the snow.</p>",
        "<p>" + "<span>" * (MAX_DEPTH + 1) + "deep" + "</span>" * (MAX_DEPTH + 1) + " text</p>",
    ):
        document = parse_html(html)
        units = inline_html(document).units
        assert [u.text for u in units if isinstance(u, Block)] == document.texts
        assert all(isinstance(u, Block) and not u.elements for u in units)
