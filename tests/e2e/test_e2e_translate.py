"""Translation over real HTTP by the real default translators, en→de and de→en (fp32, and int8:
the CPU default).

The sentences are image captions like Multi30k's, the models' training domain. The checks look
for a few content words of the target language (as word stems, with alternatives), not exact
strings, so that they hold for any decent retraining of the checkpoints.
"""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import pytest

from tests.e2e.real_models import EMBEDDER, TRANSLATOR, TRANSLATORS
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
# German caption → the English stems its translation must contain (transformer-de-en).
GERMAN_CAPTIONS: dict[str, list[tuple[str, ...]]] = {
    "Ein Mann fährt Fahrrad.": [("man",), ("bicycle", "bike", "cycl")],
    "Zwei Hunde spielen im Schnee.": [("dog",), ("snow",)],
    "Eine Frau liest ein Buch.": [("woman",), ("book",)],
    "Ein Junge springt ins Wasser.": [("boy",), ("water",)],
    "Ein schwarzer Hund rennt am Strand.": [("dog",), ("black",), ("beach",)],
    "Zwei Männer spielen Fußball auf einem Feld.": [("men", "man"), ("soccer", "football")],
}


def _missing(german: str, stems: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    words = re.findall(r"\w+", german.lower())
    return [alts for alts in stems if not any(w.startswith(a) for w in words for a in alts)]


def translate(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _check_captions(client: httpx.Client, beam_size: int, german: bool = False, **pair: str) -> None:
    captions = GERMAN_CAPTIONS if german else CAPTIONS
    body = translate(client, text=list(captions), beam_size=beam_size, **pair)
    outputs = [t["hypotheses"][0]["text"] for t in body["translations"]]
    assert len(outputs) == len(captions)
    wrong = {
        source: (output, missing)
        for (source, stems), output in zip(captions.items(), outputs, strict=True)
        if (missing := _missing(output, stems))
    }
    assert not wrong, f"translations lacking content words (beam {beam_size}): {wrong}"


@pytest.mark.parametrize("beam_size", [1, 4], ids=["greedy", "beam4"])
def test_captions_come_out_in_german(client: httpx.Client, beam_size: int) -> None:
    _check_captions(client, beam_size)


@pytest.mark.parametrize("beam_size", [1, 4], ids=["greedy", "beam4"])
def test_german_captions_come_out_in_english(client: httpx.Client, beam_size: int) -> None:
    _check_captions(client, beam_size, german=True, source_language="de", target_language="en")


def test_the_int8_variant_translates_too(int8_service: ServerProcess) -> None:
    with httpx.Client(base_url=int8_service.url, timeout=120) as client:
        _check_captions(client, beam_size=4)
        _check_captions(client, beam_size=4, german=True, source_language="de", target_language="en")


def test_the_language_pair_routes_to_its_model(client: httpx.Client) -> None:
    back = translate(client, text="Ein Hund läuft.", source_language="de", target_language="en")
    assert (back["model"], back["source_language"], back["target_language"]) == (TRANSLATORS[1], "de", "en")
    unserved = client.post("/v1/translate", json={"text": "Un chien.", "source_language": "fr"})
    assert unserved.status_code == 422, unserved.text
    assert "en→de" in unserved.text and "de→en" in unserved.text  # the served pairs are listed


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
    assert set(cards) == {*TRANSLATORS, EMBEDDER}
    assert {c["variant"] for c in cards.values()} == {"fp32"}
    for name, target in zip(TRANSLATORS, ("de", "en"), strict=True):
        assert cards[name]["task"] == "translate" and cards[name]["target_languages"] == [target]
    assert cards[EMBEDDER]["task"] == "embed" and cards[EMBEDDER]["dim"] == 384
    assert client.get("/health/live").json()["status"] == "alive"
    ready = client.get("/health/ready").json()
    assert ready["status"] == "ready" and set(ready["models"]) == {*TRANSLATORS, EMBEDDER}
    metrics = client.get("/metrics").text
    for name in (*TRANSLATORS, EMBEDDER):
        assert re.search(rf'tserve_model_info\{{[^}}]*model="{re.escape(name)}"[^}}]*variant="fp32"', metrics)
