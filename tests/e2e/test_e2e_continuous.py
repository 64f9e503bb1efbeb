"""Continuous decoding on the real int8 translator over HTTP: the same sentence gets the same
translation alone and when it joins a running decode of other requests (greedy and beam 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation.translator import OnnxTranslator
from tests.e2e.real_models import served_env, start_service
from tests.servers import ServerProcess

SENTENCES = [
    "A man is riding a bicycle down the street.",
    "Two dogs are playing in the snow.",
    "A woman in a red dress is reading a book on a bench in the park.",
    "Children play football on the beach while their parents watch from the shade of an umbrella.",
    "The cat sleeps.",
    "A group of people stand in front of a building waiting for the bus, and one of them is on the phone.",
    "An old man sells fruit at a market.",
    "Hello.",
]


@pytest.fixture(scope="module")
def continuous_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = served_env(default_artefacts, "int8", TSERVE_TRANSLATE_BATCHING="continuous")
    yield from start_service(tmp_path_factory, "service-continuous", env)


async def _staggered(url: str, beam_size: int) -> list[str]:
    """Every sentence as its own request, each sent 30 ms after the previous one, so most join
    a decode that is already running."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def one(i: int, text: str) -> str:
            await asyncio.sleep(0.03 * i)
            r = await http.post("/v1/translate", json={"text": text, "beam_size": beam_size})
            assert r.status_code == 200, r.text
            return str(r.json()["translations"][0]["hypotheses"][0]["text"])

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(SENTENCES * 3))))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_sentences_joining_a_running_decode_translate_as_alone(
    continuous_service: ServerProcess, default_artefacts: Path, beam_size: int
) -> None:
    engine = OnnxTranslator(default_artefacts / "transformer-en-de" / "int8", SessionConfig("cpu", 1))
    assert engine.manifest.translation is not None
    options = TranslateOptions(beam_size, length_penalty=engine.manifest.translation.length_penalty)
    alone = []
    for text in SENTENCES:  # as the service decodes a request that names no length penalty
        (result,) = engine.translate([TranslateItem(text, options)])
        assert isinstance(result, Translation)
        alone.append(result.hypotheses[0].text)
    served = asyncio.run(_staggered(continuous_service.url, beam_size))
    assert served == alone * 3
    admitted = continuous_service.metric("tserve_decode_admitted_sentences_count", model="transformer-en-de")
    assert admitted > 0  # they went through the continuous scheduler
