"""Translation over real HTTP by the real default translator (fp32, and int8: the CPU default).

The sentences are image captions like Multi30k's, the model's training domain. The checks look
for a few German content words (as word stems, with alternatives), not exact strings, so that
they hold for any decent retraining of the checkpoint.
"""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import pytest

from tests.e2e.real_models import EMBEDDER, TRANSLATOR
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

# English caption → the German stems its translation must contain (one of each tuple).
CAPTIONS: dict[str, list[tuple[str, ...]]] = {
    "A man is riding a bicycle.": [("mann",), ("fahrrad", "rad")],
    "Two dogs are playing in the snow.": [("hund",), ("schnee",)],
    "A woman is reading a book.": [("frau",), ("buch",)],
    "A boy is jumping into the water.": [("junge",), ("wasser",)],
    "A black dog is running on the beach.": [("hund",), ("schwarz",), ("strand",)],
    "Two men are playing soccer on a field.": [("männer", "mann"), ("fußball",)],
}


def _missing(german: str, stems: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    words = re.findall(r"\w+", german.lower())
    return [alts for alts in stems if not any(w.startswith(a) for w in words for a in alts)]


def translate(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _check_captions(client: httpx.Client, beam_size: int) -> None:
    body = translate(client, text=list(CAPTIONS), beam_size=beam_size)
    outputs = [t["hypotheses"][0]["text"] for t in body["translations"]]
    assert len(outputs) == len(CAPTIONS)
    wrong = {
        en: (de, missing)
        for (en, stems), de in zip(CAPTIONS.items(), outputs, strict=True)
        if (missing := _missing(de, stems))
    }
    assert not wrong, f"translations lacking German content words (beam {beam_size}): {wrong}"


@pytest.mark.parametrize("beam_size", [1, 4], ids=["greedy", "beam4"])
def test_captions_come_out_in_german(client: httpx.Client, beam_size: int) -> None:
    _check_captions(client, beam_size)


def test_the_int8_variant_translates_too(int8_service: ServerProcess) -> None:
    with httpx.Client(base_url=int8_service.url, timeout=120) as client:
        _check_captions(client, beam_size=4)


def test_response_names_model_languages_and_usage(client: httpx.Client) -> None:
    body = translate(client, text="A man is riding a bicycle.")
    assert (body["model"], body["source_language"], body["target_language"]) == (TRANSLATOR, "en", "de")
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
    (translation,) = body["translations"]
    assert len(translation["hypotheses"]) == 1
    assert "tokens" not in translation["hypotheses"][0] and "source_tokens" not in translation


def test_n_best_hypotheses_are_distinct_and_ranked_by_score(client: httpx.Client) -> None:
    texts = ["Two dogs are playing in the snow.", "A woman is reading a book."]
    best = translate(client, text=texts, beam_size=4)
    ranked = translate(client, text=texts, beam_size=4, n_best=3)
    for one, three in zip(best["translations"], ranked["translations"], strict=True):
        hyps = three["hypotheses"]
        assert len(hyps) == 3 and len({h["text"] for h in hyps}) == 3, hyps
        scores = [h["score"] for h in hyps]
        assert all(math.isfinite(s) and s <= 0 for s in scores), scores  # log-probabilities
        assert scores == sorted(scores, reverse=True), scores
        # More hypotheses only widen the search: its best is no worse than the 1-best's.
        assert scores[0] >= one["hypotheses"][0]["score"] - 1e-4


def test_alignments_are_attention_rows_over_the_source(client: httpx.Client) -> None:
    body = translate(client, text="Two dogs are playing in the snow.", beam_size=4, n_best=2, alignments=True)
    (translation,) = body["translations"]
    source = translation["source_tokens"]
    assert any("dog" in t for t in source), source
    for hyp in translation["hypotheses"]:
        tokens, alignment = hyp["tokens"], hyp["alignment"]
        assert tokens and len(alignment) == len(tokens)
        for row in alignment:
            assert len(row) == len(source)
            assert all(w >= 0 for w in row) and math.isclose(sum(row), 1.0, abs_tol=1e-3)
    # The best hypothesis's "Hund…" attends most to the source's "dog…".
    best = translation["hypotheses"][0]
    (dogs,) = [i for i, t in enumerate(best["tokens"]) if "hund" in t.lower()]
    row = best["alignment"][dogs]
    assert "dog" in source[row.index(max(row))], (best["tokens"], source, row)


def test_models_health_and_metrics_describe_the_fp32_service(client: httpx.Client) -> None:
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert set(cards) == {TRANSLATOR, EMBEDDER}
    assert {c["variant"] for c in cards.values()} == {"fp32"}
    assert cards[TRANSLATOR]["task"] == "translate" and cards[TRANSLATOR]["target_languages"] == ["de"]
    assert cards[EMBEDDER]["task"] == "embed" and cards[EMBEDDER]["dim"] == 384
    assert client.get("/health/live").json()["status"] == "alive"
    ready = client.get("/health/ready").json()
    assert ready["status"] == "ready" and set(ready["models"]) == {TRANSLATOR, EMBEDDER}
    metrics = client.get("/metrics").text
    for name in (TRANSLATOR, EMBEDDER):
        assert re.search(rf'tserve_model_info\{{[^}}]*model="{re.escape(name)}"[^}}]*variant="fp32"', metrics)
