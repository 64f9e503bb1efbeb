"""engine/translation/spare_buffers.py: a decode takes the last decode's cache buffers whole, and
translates on them as on fresh zeros."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.engine.base import KeepsSpareMemory, TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation.spare_buffers import SpareBuffers
from service.engine.translation.translator import OnnxTranslator

LONG = ["a small cat sits on the big red street with two dogs and a man", "two dogs run on the grass"]
SHORT = ["red", "a man sits", "two dogs run"]


@pytest.fixture(scope="module")
def translator(translation_artefact: Path) -> OnnxTranslator:
    return OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))


def translated(translator: OnnxTranslator, texts: list[str], beam: int) -> list[tuple[str, float]]:
    results = translator.translate([TranslateItem(t, TranslateOptions(beam_size=beam)) for t in texts])
    assert all(isinstance(r, Translation) for r in results)
    return [(r.hypotheses[0].text, r.hypotheses[0].score) for r in results if isinstance(r, Translation)]


def kept(translator: OnnxTranslator) -> np.ndarray:
    spare: SpareBuffers = translator._spare
    buffers = spare.take(0, 0)
    assert buffers is not None, "the last decode left no buffers"
    spare.give(buffers)
    return buffers


@pytest.mark.parametrize("beam", [1, 4])
def test_the_next_decode_takes_the_buffers_and_its_results_are_those_of_fresh_ones(
    translator: OnnxTranslator, beam: int
) -> None:
    translator.release_spare_memory()
    fresh = translated(translator, SHORT, beam)
    translated(translator, LONG, beam)  # wider, longer buffers, kept
    buffers = kept(translator)
    buffers[...] = np.nan  # whatever a taken buffer holds beyond what is written is never read
    assert translated(translator, SHORT, beam) == fresh
    assert kept(translator) is buffers  # taken and given back, not new


def test_a_decode_that_outgrows_them_lets_them_go_and_release_empties_the_spare() -> None:
    spare = SpareBuffers()
    spare.give(np.zeros((2, 8, 2, 16, 4)))
    assert spare.nbytes == 2 * 8 * 2 * 16 * 4 * 8
    assert spare.take(9, 16) is None and spare.nbytes == 0  # more rows: not kept beside the new ones
    spare.give(np.zeros((2, 8, 2, 16, 4)))
    assert spare.take(4, 17) is None and spare.nbytes == 0  # longer histories
    spare.give(np.zeros((2, 8, 2, 16, 4)))
    assert spare.take(8, 16) is not None  # enough: taken whole
    spare.give(np.zeros((2, 8, 2, 16, 4)))
    assert spare.release() == 2 * 8 * 2 * 16 * 4 * 8 and spare.release() == 0
    spare.give(np.zeros((2, 0, 2, 0, 4)))  # an empty decode's buffers are not worth keeping
    assert spare.take(0, 0) is None


def test_the_engine_lets_them_go_when_told(translator: OnnxTranslator) -> None:
    translated(translator, SHORT, 4)
    assert isinstance(translator, KeepsSpareMemory)
    assert translator.release_spare_memory() > 0
    assert translator.release_spare_memory() == 0
