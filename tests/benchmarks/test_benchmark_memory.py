"""The memory stage's load: every sentence sent once, in the order described, every request
answered; a load that was not served raises rather than giving a figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import memory
from tests.servers import server_process, small_server_command


def test_the_load_sends_each_translator_s_sentences_at_beam_4_then_greedy_then_the_embeddings() -> None:
    en = [f"en {i}" for i in range(70)]
    de = [f"de {i}" for i in range(33)]
    sentences = [f"s {i}" for i in range(130)]
    load = memory.phases({"transformer-en-de": en, "transformer-de-en": de}, sentences)
    assert [p.name for p in load] == [
        "transformer-en-de, beam 4",
        "transformer-en-de, beam 1",
        "transformer-de-en, beam 4",
        "transformer-de-en, beam 1",
        "all-MiniLM-L6-v2, 130 sentences",
    ]
    for phase, model, texts, beam in zip(
        load,
        ["transformer-en-de"] * 2 + ["transformer-de-en"] * 2,
        [en, en, de, de],
        [4, 1, 4, 1],
        strict=False,
    ):
        assert phase.path == "/v1/translate"
        assert all(b["model"] == model and b["beam_size"] == beam for b in phase.bodies)
        assert all(len(b["text"]) <= memory.TRANSLATE_BATCH for b in phase.bodies)
        assert [t for b in phase.bodies for t in b["text"]] == texts
    embed = load[-1]
    assert embed.path == "/v1/embeddings" and all(len(b["input"]) <= memory.EMBED_BATCH for b in embed.bodies)
    assert [t for b in embed.bodies for t in b["input"]] == sentences


def test_a_phase_sends_every_request_once_and_a_refused_one_fails_it(tmp_path: Path) -> None:
    sentences = [f"sentence {i}" for i in range(100)]
    bodies = [{"input": chunk, "model": "small-embed"} for chunk in memory.chunks(sentences, 7)]
    with server_process(small_server_command(), {}, tmp_path / "server.log") as server:
        memory.drive(server.url, memory.Phase("embed", "/v1/embeddings", bodies))
        assert server.metric("tserve_batch_size_sum", model="small-embed") == 100
        assert server.metric("tserve_requests_total", endpoint="/v1/embeddings", status="200") == 15
        refused = memory.Phase("unknown model", "/v1/embeddings", [{"input": ["x"], "model": "nope"}])
        with pytest.raises(RuntimeError, match="unknown model: 1 requests failed"):
            memory.drive(server.url, refused)
