"""benchmarks/translators.py's in-process system: a batch dealt out to lanes side by side, each
lane one ``translate`` call of the real engine on its own thread, with the results one decode gives."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from benchmarks.translators import OursInProcess
from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation.translator import OnnxTranslator

TEXTS = [
    "a man rides a bike",
    "two dogs run",
    "a small cat sits on the big red street",
    "the cat",
    "red",
    "big dogs sit on a man",
]


def ok(result: object) -> Translation:
    assert isinstance(result, Translation), result
    return result


def test_lanes_translate_a_batch_side_by_side_with_the_same_results(
    translation_artefact: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With lanes the batch is dealt out to translate calls on as many threads (each gets long
    and short sentences alike), and every item's result is what one decode gives it."""
    laned = OursInProcess(translation_artefact, 2, "ours in-process")
    seen: dict[str, list[str]] = {}
    translate = laned.engine.translate

    def spy(items: list[TranslateItem]) -> object:
        seen[threading.current_thread().name] = [item.text for item in items]
        return translate(items)

    monkeypatch.setattr(laned.engine, "translate", spy)
    batch = [
        *(TranslateItem(t, TranslateOptions(beam_size=4, n_best=2, max_length=12)) for t in TEXTS),
        TranslateItem(" "),
        *(TranslateItem(t, TranslateOptions(beam_size=1)) for t in TEXTS[:2]),
    ]
    got = laned.dealt_out(batch)
    assert len(seen) == 2 and sorted(t for lane in seen.values() for t in lane) == sorted(
        i.text for i in batch
    )
    assert sorted(len(lane) for lane in seen.values()) == [4, 5]
    assert threading.current_thread().name in seen  # the first lane on the caller's thread
    one_decode = OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))
    for result, want in zip(got, one_decode.translate(batch), strict=True):
        assert [h.tokens for h in ok(result).hypotheses] == [h.tokens for h in ok(want).hypotheses]
        assert [h.score for h in ok(result).hypotheses] == pytest.approx(
            [h.score for h in ok(want).hypotheses]
        )
    seen.clear()
    laned.dealt_out(batch[:1])
    assert list(seen) == [threading.current_thread().name]  # one sentence: no hand-off to another thread
    with pytest.raises(ValueError, match="lanes"):
        OursInProcess(translation_artefact, 0, "no lanes")
