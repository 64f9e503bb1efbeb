"""benchmarks/host/translation.py: the real translator with free onnxruntime runs, on both layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.host.free_runs import FreeRuns
from benchmarks.host.translation import (
    SENTENCES,
    STEPS,
    continuous,
    free_translator,
    measure,
    report,
    whole_batch,
)
from benchmarks.results import Figure, Results
from service.engine.base import TranslateItem, TranslateOptions


@pytest.fixture(scope="module", params=["cpu", "device"])
def layout(
    request: pytest.FixtureRequest, translation_artefact: Path, translation_fp16: Path
) -> tuple[str, Path]:
    return request.param, translation_artefact if request.param == "cpu" else translation_fp16


def test_every_sentence_ends_after_the_fixed_steps_whatever_its_batch(layout: tuple[str, Path]) -> None:
    runs = FreeRuns()
    with free_translator(layout[1], layout[0], runs) as engine:
        for batch in (1, 5):
            before = runs.runs["decoder"]
            items = [TranslateItem(f"a dog runs {i}", TranslateOptions(beam_size=4)) for i in range(batch)]
            results = engine.translate(items)
            assert runs.runs["decoder"] - before == STEPS  # the batch's sentences step together
            for r in results:
                assert not isinstance(r, Exception)
                assert len(r.hypotheses[0].tokens) == STEPS - 1  # </s> was the last step's token
    assert runs.runs["encoder"] == 2


def test_runs_per_step_count_the_cache_moves(layout: tuple[str, Path]) -> None:
    runs = FreeRuns()
    with free_translator(layout[1], layout[0], runs) as engine:
        cost = whole_batch(engine, runs, 3, 4, calls=2)  # two calls, one after the other
    assert cost.sentence_steps == 2 * 3 * STEPS and runs.runs["decoder"] == 2 * STEPS
    # slots: the graph writes the cache in place; positions: the graph gathers the past by beam_rows
    assert cost.runs_per_step == 1 and runs.runs["other"] == 0


def test_continuous_decoding_joins_sentences_between_steps(translation_artefact: Path) -> None:
    runs = FreeRuns()
    with free_translator(translation_artefact, "cpu", runs) as engine:
        cost = continuous(engine, runs, 8, 4, waves=2)
    assert cost.sentence_steps == 16 * STEPS
    # 8 at a time, one joining a step at most (8 / STEPS rounded up): more steps than one batch's
    assert runs.runs["decoder"] > 2 * STEPS


def test_the_report_files_each_layouts_figures(translation_artefact: Path) -> None:
    runs = FreeRuns()
    with free_translator(translation_artefact, "cpu", runs) as engine:
        costs = measure(engine, runs, [1, 2], rounds=1)
    assert set(costs) == {"whole/1", "whole/2", "continuous/2"}
    # a small batch's figure is over many calls' steps, not one call's
    assert costs["whole/1"].sentence_steps == SENTENCES * STEPS
    costs["whole/128"] = costs["whole/2"]
    results = Results()
    report(results, "cpu", costs)
    row = results.figure(Figure.HOST_CPU_BATCH128)
    assert row is not None and row.value == costs["whole/2"].us_per_sentence_step
    one = results.figure(Figure.HOST_CPU_ONE)
    assert one is not None and one.value == pytest.approx(costs["whole/1"].us_per_sentence_step / 1000)
