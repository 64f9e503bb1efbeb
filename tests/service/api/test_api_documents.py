"""POST /v1/translate with real text: sentences are the unit, nothing is lost, the layout is kept."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.service.api.conftest import Served, error_of, metric, serving, small_settings

pytestmark = pytest.mark.anyio

PARAGRAPH = (
    "A man is riding a bicycle down the street. Two dogs are playing in the snow. "
    "A woman is reading a book in a park while children play around her."
)

# Lists, dialogue, numbers, abbreviations, URLs, emoji, very long sentences, odd whitespace.
TEXTS = [
    PARAGRAPH,
    "Shopping list:\n\n- Buy milk.\n- Walk the dog\n* Call mom\n1. First thing.\n2) Second thing.\n",
    '"Where are you going?" she asked.\n"Home," he said. "It is late."\n\n— Fine. See you!',
    "The price rose 3.5% to $12.40 in 2023. Version 2.0 ships on Jan. 5. Dr. Smith agrees.",
    "Read https://example.com/a.b?c=d first. Then mail john.doe@example.org about it.",
    "I love it 😀. Great day!!! 👍 See you soon.\r\nBye.",
    " ".join(f"word{i}" for i in range(60)) + ".",  # one sentence of 61 tokens: cut into pieces
    "one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen.",
    "   Indented line.\n\tTabbed line.\n\n\n   Last line.   ",
    "x" * 150,  # no spaces at all: cut at the token limit
]


def reverse_words(sentence: str) -> str:
    return " ".join(sentence.split()[::-1])


def layout(text: str) -> list[str]:
    """What must survive translation: line breaks and which lines are blank."""
    return ["" if not line.strip() else "text" for line in re.split(r"\r\n|\r|\n", text)]


def documents_settings(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "max_chars_per_text": 5000,
        "max_translate_chars_per_request": 20_000,
        "max_body_bytes": 65536,
        "max_queue": 1024,
        **overrides,
    }
    return small_settings(**values)


async def test_the_paragraph_comes_back_as_three_sentences(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": PARAGRAPH})
    assert r.status_code == 200, r.text
    [translation] = r.json()["translations"]
    sentences = translation["sentences"]
    assert [s["source"] for s in sentences] == [
        "A man is riding a bicycle down the street.",
        "Two dogs are playing in the snow.",
        "A woman is reading a book in a park while children play around her.",
    ]
    for s in sentences:
        assert PARAGRAPH[s["start"] : s["end"]] == s["source"]
        assert s["pieces"] == 1
    expected = " ".join(s["hypotheses"][0]["text"] for s in sentences)
    assert translation["hypotheses"][0]["text"] == expected
    assert expected.startswith("STREET. the down bicycle")  # ReverseTranslator, per sentence
    assert "tokens" not in translation["hypotheses"][0]  # a multi-sentence text: details per sentence


@pytest.mark.parametrize("text", TEXTS)
async def test_every_sentence_is_translated_in_order_and_the_layout_is_kept(text: str) -> None:
    async with serving(documents_settings()) as served:
        r = await served.client.post("/v1/translate", json={"text": text, "beam_size": 1})
        assert r.status_code == 200, r.text
        [translation] = r.json()["translations"]
        output = translation["hypotheses"][0]["text"]
        assert layout(output) == layout(text)
        position, found_at = 0, 0
        for s in translation["sentences"]:
            best = s["hypotheses"][0]["text"]
            assert s["source"].strip() and best.strip()
            assert s["start"] >= position, "sentences out of order"
            assert text[s["start"] : s["end"]] == s["source"]
            position = s["end"]
            found_at = output.find(best, found_at)
            assert found_at >= 0, ("a translation missing or out of order", best, output)
            found_at += len(best)
        outside = "".join(
            c
            for i, c in enumerate(text)
            if not any(s["start"] <= i < s["end"] for s in translation["sentences"])
        )
        assert set(outside) <= set(" \t\r\n-*•–—.)0123456789"), outside  # only layout and list markers
        sources = [w.lower() for s in translation["sentences"] for w in s["source"].split()]
        targets = [w.lower() for s in translation["sentences"] for w in s["hypotheses"][0]["text"].split()]
        assert sorted(targets) == sorted(sources)  # the small model keeps every word


async def test_a_sentence_over_the_models_input_is_cut_into_pieces_never_truncated(served: Served) -> None:
    long = " ".join(f"w{i}" for i in range(40))  # 41 tokens; the small model takes 16
    r = await served.client.post("/v1/translate", json={"text": long, "beam_size": 1, "alignments": True})
    assert r.status_code == 200, r.text
    [sentence] = r.json()["translations"][0]["sentences"]
    assert sentence["pieces"] == 4  # halved, then halved again: 10 words each
    best = sentence["hypotheses"][0]
    assert sorted(best["text"].lower().split()) == sorted(long.split())  # every word, once
    assert len(best["tokens"]) == 40
    assert len(best["alignment"]) == 40 and all(len(row) == 40 for row in best["alignment"])
    # block-diagonal: the first piece's outputs attend only to the first piece's inputs
    first_piece = next(i for i, t in enumerate(best["tokens"]) if i and t.isupper())  # hypothesis 0
    assert 0 < first_piece < 16  # upper-cases each piece's first output word
    assert all(sum(row[first_piece:]) == 0.0 for row in best["alignment"][:first_piece])
    assert r.json()["usage"]["input_tokens"] == 40 + 4  # each piece has its own end token


async def test_sentences_are_the_unit_of_batching(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": ["One. Two. Three.", "Four. Five."]})
    assert r.status_code == 200
    items = [text for batch in served.translator.hooks.batches for text in batch]
    assert sorted(items) == ["Five.", "Four.", "One.", "Three.", "Two."]
    first, second = r.json()["translations"]
    assert first["hypotheses"][0]["text"] == "ONE. TWO. THREE."
    assert second["hypotheses"][0]["text"] == "FOUR. FIVE."


async def test_a_document_shares_batches_with_a_later_one_sentence_request() -> None:
    settings = documents_settings(max_batch_size=4, max_wait_ms=50.0)
    async with serving(settings, delay_s=0.05) as served:
        document = " ".join(f"Sentence number {i} is here." for i in range(40))
        long_request = asyncio.create_task(served.client.post("/v1/translate", json={"text": document}))
        await asyncio.sleep(0.02)  # the document is queued, its first batch running
        short = await served.client.post("/v1/translate", json={"text": "Hello there."})
        assert short.status_code == 200
        assert not long_request.done(), "the short request waited for the whole document"
        assert (await long_request).status_code == 200
        batches = served.translator.hooks.batches
        with_short = next(i for i, b in enumerate(batches) if "Hello there." in b)
        assert with_short <= 2 < len(batches)


async def test_n_best_of_a_text_is_each_sentence_k_th_hypothesis(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "Ab cd. Ef gh.", "beam_size": 2, "n_best": 2})
    [translation] = r.json()["translations"]
    assert [h["text"] for h in translation["hypotheses"]] == ["CD. Ab GH. Ef", "cd. AB gh. EF"]
    assert [len(s["hypotheses"]) for s in translation["sentences"]] == [2, 2]
    scores = [h["score"] for h in translation["hypotheses"]]
    assert scores == [pytest.approx(-0.1), pytest.approx(-0.2)]  # equal lengths: the mean


async def test_alignments_of_a_multi_sentence_text_are_per_sentence(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "Ab cd. Ef gh ij.", "alignments": True})
    [translation] = r.json()["translations"]
    assert "source_tokens" not in translation
    first, second = translation["sentences"]
    assert first["source_tokens"] == ["Ab", "cd."]
    assert second["hypotheses"][0]["alignment"][0] == [0.0, 0.0, 1.0]


async def test_one_sentence_texts_keep_their_details_at_the_top(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "  one two  ", "alignments": True})
    [translation] = r.json()["translations"]
    assert translation["hypotheses"][0]["text"] == "  TWO one  "  # surrounding whitespace kept
    assert translation["hypotheses"][0]["tokens"] == ["TWO", "one"]
    assert translation["source_tokens"] == ["one", "two"]


async def test_limits_for_documents_are_422_with_the_limit(served: Served) -> None:
    async with serving(documents_settings(max_translate_chars_per_request=100)) as s:
        r = await s.client.post("/v1/translate", json={"text": ["a" * 60, "b" * 60]})
        assert r.status_code == 422
        error = error_of(r)
        assert (error["details"][0]["type"], error["limit"]) == ("too_long", 100)
    async with serving(documents_settings(max_sentences_per_request=5)) as s:
        r = await s.client.post("/v1/translate", json={"text": "One. Two. Three.\nFour.\nFive.\nSix."})
        assert r.status_code == 422
        error = error_of(r)
        assert (error["details"][0]["type"], error["limit"]) == ("too_many_sentences", 5)
        assert "got 6" in error["message"]
        assert s.translator.hooks.batches == []


async def test_the_queue_refuses_a_whole_document_or_takes_all_of_it() -> None:
    async with serving(
        documents_settings(max_queue=8, max_items_per_request=2, max_batch_size=2), delay_s=0.2
    ) as served:
        first = asyncio.create_task(
            served.client.post("/v1/translate", json={"text": "One. Two. Three. Four. Five. Six."})
        )
        await asyncio.sleep(0.05)
        r = await served.client.post("/v1/translate", json={"text": "Seven. Eight. Nine. Ten. Eleven."})
        assert r.status_code == 429 and "Retry-After" in r.headers
        name = served.translator.manifest.name
        assert metric("tserve_rejected_total", model=name, reason="queue_full") == 5
        assert (await first).status_code == 200


async def test_a_document_over_the_queue_size_is_422_not_429() -> None:
    async with serving(documents_settings(max_queue=8, max_items_per_request=2)) as served:
        r = await served.client.post(
            "/v1/translate", json={"text": "One. Two. Three. Four. Five. Six. Seven. Eight. Nine."}
        )
        assert r.status_code == 422
        assert error_of(r)["limit"] == 8


async def test_a_request_over_the_decode_cost_cap_is_422_before_queueing() -> None:
    async with serving(documents_settings(max_decode_cost_per_request=100)) as served:
        ok = await served.client.post(
            "/v1/translate", json={"text": "One. Two.", "beam_size": 2, "max_length": 16}
        )
        assert ok.status_code == 200  # 2 × 2 × 16 = 64
        r = await served.client.post(
            "/v1/translate", json={"text": "One. Two.", "beam_size": 4, "max_length": 16}
        )
        assert r.status_code == 422
        error = error_of(r)
        assert (error["details"][0]["type"], error["limit"]) == ("decode_cost_too_high", 100)
        assert "2 sentences × beam_size 4 × max_length 16 = 128" in error["message"]
        assert len(served.translator.hooks.batches) == 1  # the second never reached the engine


async def test_max_length_beyond_the_model_is_422_and_its_default_is_the_models(served: Served) -> None:
    r = await served.client.post("/v1/translate", json={"text": "hi", "max_length": 17})
    assert r.status_code == 422
    assert error_of(r)["limit"] == 16  # the small model writes at most 16 tokens
    models = (await served.client.get("/v1/models")).json()["data"]
    assert next(m for m in models if m["task"] == "translate")["max_output_tokens"] == 16
    assert (await served.client.post("/v1/translate", json={"text": "hi"})).status_code == 200
