"""Real text through the real default translator over real HTTP: paragraphs, a 200-sentence
document, HTML, and LibreTranslate's API driven by its own Python client (``libretranslatepy``)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "A man is riding a bicycle down the street. Two dogs are playing in the snow. "
    "A woman is reading a book in a park while children play around her."
)

SUBJECTS = [
    "A man",
    "A woman",
    "Two children",
    "A young girl",
    "An old man",
    "Three dogs",
    "A boy",
    "Two women",
]
ACTIONS = ["is walking", "is sitting", "are standing", "is running", "is playing", "is waiting", "is eating"]
PLACES = ["on the beach.", "in the park.", "near a river.", "on a busy street.", "in front of a house."]


def captions(n: int) -> list[str]:
    """``n`` distinct caption-like sentences (the model's domain), made here, not from a test set."""
    out = [f"{s} {a} {p}" for s in SUBJECTS for a in ACTIONS for p in PLACES]
    return out[:n]


def document(sentences: list[str]) -> str:
    """Paragraphs of five sentences separated by blank lines, and a bullet list every 50."""
    parts: list[str] = []
    for i in range(0, len(sentences), 5):
        group = sentences[i : i + 5]
        if (i // 5) % 10 == 9:
            parts.append("\n".join(f"- {s}" for s in group))
        else:
            parts.append(" ".join(group))
    return "\n\n".join(parts)


def lines(text: str) -> list[str]:
    return [
        "" if not line.strip() else ("- " if line.startswith("- ") else "text") for line in text.split("\n")
    ]


def translate(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_the_paragraph_comes_back_as_three_german_sentences(client: httpx.Client) -> None:
    (translation,) = translate(client, text=PARAGRAPH)["translations"]
    german = translation["hypotheses"][0]["text"]
    assert len(translation["sentences"]) == 3
    assert len(re.findall(r"[.!?](\s|$)", german)) == 3, german
    for stem in ("mann", "fahrrad", "hund", "schnee", "frau", "buch"):
        assert stem in german.lower(), (stem, german)


def test_a_200_sentence_document_keeps_every_sentence_and_line_break(client: httpx.Client) -> None:
    sentences = captions(200)
    text = document(sentences)
    (translation,) = translate(client, text=text, beam_size=4)["translations"]
    german = translation["hypotheses"][0]["text"]
    assert [s["source"] for s in translation["sentences"]] == sentences
    assert all(s["hypotheses"][0]["text"].strip() for s in translation["sentences"])
    assert lines(german) == lines(text)
    alone = translate(client, text=sentences[:20], beam_size=4)["translations"]
    in_document = [s["hypotheses"][0]["text"] for s in translation["sentences"][:20]]
    assert in_document == [t["hypotheses"][0]["text"] for t in alone]  # same answer either way


def test_html_keeps_the_markup_and_translates_the_text(client: httpx.Client) -> None:
    html = (
        '<div class="caption"><p>A man is riding a bicycle.</p>\n'
        '<p title="A dog in the snow">Two dogs are <b>playing</b> in the snow.</p>'
        "<script>var x = 'A man is riding a bicycle.';</script></div>"
    )
    (translation,) = translate(client, text=html, format="html")["translations"]
    german = translation["hypotheses"][0]["text"]
    tags_in, tags_out = re.findall(r"<[^>]+>", html), re.findall(r"<[^>]+>", german)
    assert len(tags_out) == len(tags_in), german
    for before, after in zip(tags_in, tags_out, strict=True):
        assert after == before or ("title=" in before and after.startswith("<p title=")), (before, after)
    assert "<script>var x = 'A man is riding a bicycle.';</script>" in german
    assert "mann" in german.lower() and "hund" in german.lower()
    assert 'title="A dog in the snow"' not in german  # the attribute was translated too


def test_libretranslatepy_translates_and_lists_languages(service: ServerProcess) -> None:
    lt = LibreTranslateAPI(service.url)
    german = lt.translate(PARAGRAPH, source="en", target="de")
    assert isinstance(german, str) and len(re.findall(r"[.!?](\s|$)", german)) == 3
    assert "hund" in german.lower()
    assert lt.languages() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]
    assert "mann" in lt.translate("A man is riding a bicycle.", source="auto", target="de").lower()
    assert "dog" in lt.translate("Ein Hund läuft im Schnee.", source="de", target="en").lower()
