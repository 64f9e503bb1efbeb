"""One model, many pairs: a tiny random M2M-100 (en, de, fr) exported through ``python -m
export``'s path and served by ``python -m service`` beside a tiny en→de model of its own, over
HTTP. Every pair it serves is listed; a pair goes to the model of that pair before the
multilingual one; each request's languages pick the tokens (its outputs equal transformers'
``generate`` with that source token and ``forced_bos_token_id``); sentences into different
languages share the running decode and each equals its translation alone."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.session import SessionConfig
from service.engine.translation.translator import OnnxTranslator
from tests.servers import ServerProcess, artefact_env, server_process, service_command

TEXTS = ["a man rides the big red bike .", "two dogs run", "small cat sits on the street", "the red cat"]
PAIRS = [("en", "de"), ("en", "fr"), ("de", "fr"), ("fr", "en"), ("de", "en")]
LIMIT = 10  # output tokens: a random model otherwise writes up to its maximum


@pytest.fixture(scope="module")
def m2m_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.tiny_models import tiny_m2m100_dir

    return tiny_m2m100_dir(tmp_path_factory.mktemp("hf") / "tiny-m2m", seed=2)


@pytest.fixture(scope="module")
def m2m_artefact(m2m_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.translation import export_translation

    reference = tmp_path_factory.mktemp("reference") / "reference.txt"  # the export's own checks
    reference.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")  # on a few sentences: fast
    (directory,) = export_translation(
        m2m_source, tmp_path_factory.mktemp("artefacts"), ["fp32"], reference=reference
    )
    return directory


@pytest.fixture(scope="module")
def server(
    translation_artefact: Path,
    m2m_artefact: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("served-artefacts")
    for artefact in (translation_artefact, m2m_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    env = artefact_env(root)
    del env["TSERVE_TRANSLATE_MODEL"]
    env |= {
        "TSERVE_TRANSLATE_MODELS": "tiny-en-de,tiny-m2m",
        "TSERVE_EMBED_MODEL": "",
        "TSERVE_TRANSLATE_BATCHING": "continuous",
        "TSERVE_TRANSLATION_CACHE_BYTES": "0",  # every request decoded, none answered from the cache
        "TSERVE_MAX_WAIT_MS": "20",
    }
    with server_process(service_command(), env, tmp_path_factory.mktemp("server") / "server.log") as s:
        yield s


def _translate(url: str, text: str, source: str, target: str, **options: Any) -> dict[str, object]:
    body = {"text": text, "source_language": source, "target_language": target, **options}
    r = httpx.post(f"{url}/v1/translate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _tokens(answer: dict[str, object]) -> list[str]:
    translations = answer["translations"]
    assert isinstance(translations, list)
    return list(translations[0]["hypotheses"][0]["tokens"])


def test_every_pair_is_listed_beside_the_bilingual_model(server: ServerProcess) -> None:
    cards = {c["id"]: c for c in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert (cards["tiny-m2m"]["source_languages"], cards["tiny-m2m"]["target_languages"]) == (
        ["en", "de", "fr"],
        ["de", "en", "fr"],
    )
    languages = {entry["code"]: entry["targets"] for entry in httpx.get(f"{server.url}/languages").json()}
    assert languages == {"en": ["de", "fr"], "de": ["en", "fr"], "fr": ["de", "en"]}


@pytest.mark.parametrize(
    ("source", "target", "model", "listed"),
    [
        ("en", "de", None, "tiny-en-de"),  # both serve it: the model of the pair
        ("en", "de", "tiny-m2m", "tiny-m2m"),  # unless the request names the multilingual one
        ("en", "fr", None, "tiny-m2m"),
        ("fra", "deu", None, "tiny-m2m"),  # ISO 639-3 codes
        ("de_Latn", "eng_Latn", None, "tiny-m2m"),
    ],
)
def test_a_pair_picks_its_model(
    server: ServerProcess, source: str, target: str, model: str | None, listed: str
) -> None:
    answer = _translate(server.url, "two dogs run", source, target, **({"model": model} if model else {}))
    assert answer["model"] == listed


def test_an_unserved_pair_is_refused_naming_the_languages(server: ServerProcess) -> None:
    body = {"text": "two dogs", "source_language": "en", "target_language": "es"}
    r = httpx.post(f"{server.url}/v1/translate", json=body, timeout=30)
    assert r.status_code == 422 and "served pairs: en→de, any two of de, en, fr" in r.text, r.text
    r = httpx.post(f"{server.url}/translate", json={"q": "two", "source": "en", "target": "es"}, timeout=30)
    assert r.status_code == 400 and "any two of de, en, fr" in r.json()["error"], r.text
    r = httpx.post(
        f"{server.url}/translate", json={"q": "two dogs", "source": "de", "target": "fr"}, timeout=30
    )
    assert r.status_code == 200 and r.json()["translatedText"], r.text  # LibreTranslate's API: served


def test_the_languages_pick_the_tokens_as_transformers_generate_does(
    server: ServerProcess, m2m_source: Path
) -> None:
    from tokenizers import Tokenizer
    from transformers import M2M100ForConditionalGeneration

    from export.sources.hf_seq2seq import Seq2SeqReference

    model = M2M100ForConditionalGeneration.from_pretrained(str(m2m_source)).eval()
    tokenizer = Tokenizer.from_file(str(m2m_source / "tokenizer.json"))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    language = {code: vocab[f"__{code}__"] for code in ("en", "de", "fr")}
    outputs = set()
    for (source, target), text in itertools.product(PAIRS, TEXTS[:2]):
        reference = Seq2SeqReference(model, pad_id=1, eos_id=2, forced_first=language[target])
        ids = [language[source], *tokenizer.encode(text).ids, 2]
        (want,) = reference.greedy([ids], [LIMIT])
        answer = _translate(
            server.url, text, source, target, model="tiny-m2m", beam_size=1, max_length=LIMIT, alignments=True
        )
        assert _tokens(answer) == [tokenizer.id_to_token(i) for i in want], (source, target, text)
        outputs.add(tuple(want))
    assert len(outputs) > len(TEXTS[:2])  # the languages change the output, not the text alone


@pytest.mark.parametrize("beam_size", [1, 4])
def test_sentences_into_different_languages_share_the_decode_and_translate_as_alone(
    server: ServerProcess, m2m_artefact: Path, beam_size: int
) -> None:
    asked = [(text, source, target) for text in TEXTS for source, target in PAIRS]
    options: dict[str, Any] = {"model": "tiny-m2m", "beam_size": beam_size, "max_length": LIMIT}
    start = _steps(server)
    alone = [_translate(server.url, *a, **options)["translations"] for a in asked]
    steps_alone = _steps(server) - start

    async def together() -> list[object]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:

            async def one(text: str, source: str, target: str) -> object:
                body = {"text": text, "source_language": source, "target_language": target, **options}
                r = await http.post("/v1/translate", json=body)
                assert r.status_code == 200, r.text
                return r.json()["translations"]

            return list(await asyncio.gather(*(one(*a) for a in asked)))

    start = _steps(server)
    assert asyncio.run(together()) == alone
    steps_together = _steps(server) - start
    # the sentences of every target language were decoded side by side, not one after another
    assert steps_together < steps_alone / 3, (steps_together, steps_alone)

    # in the engine too: one running decode of every language, each sentence as alone
    engine = OnnxTranslator(m2m_artefact, SessionConfig("cpu", 1))
    languages = engine.manifest.translation.language_tokens if engine.manifest.translation else {}
    items_of = [
        TranslateItem(
            text,
            TranslateOptions(
                beam_size,
                max_length=LIMIT,
                forced_first_token=languages[target],
                source_token=languages[source],
            ),
        )
        for text, source, target in asked
    ]
    mixed = engine.translate(items_of)
    one_by_one = [engine.translate([item])[0] for item in items_of]
    assert all(isinstance(t, Translation) for t in mixed)
    assert [_best(t) for t in mixed] == [_best(t) for t in one_by_one]
    assert [_best(t) for t in mixed] == [a[0]["hypotheses"][0]["text"] for a in alone]  # type: ignore[index]


def _best(result: Translation | Exception) -> str:
    assert isinstance(result, Translation)
    return result.hypotheses[0].text


def _steps(server: ServerProcess) -> float:
    """The multilingual model's decoder steps so far (each over every running sentence)."""
    return server.metric("tserve_decode_step_seconds_count", model="tiny-m2m")


def test_the_playground_offers_the_multilingual_models_languages(server: ServerProcess) -> None:
    """In a real browser (Debian's chromium): the multilingual model's languages become two
    choices, and the translation asked for goes out with them; the model of one pair has none."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/install-tools.sh installs it with apt-get)")
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page()
        sent: list[Any] = []
        page.on("request", lambda r: sent.append(r.post_data_json) if "/v1/translate" in r.url else None)
        page.goto(f"{server.url}/")
        expect(page.locator("#translate-model option")).to_have_text(
            ["tiny-en-de (en→de)", "tiny-m2m (3 languages)"]
        )
        expect(page.locator("#translate-languages")).to_be_hidden()
        page.select_option("#translate-model", "tiny-m2m")
        expect(page.locator("#translate-source option")).to_have_text(
            ["English (en)", "German (de)", "French (fr)"]
        )
        page.select_option("#translate-source", "fr")
        page.select_option("#translate-target", "de")
        page.fill("#translate-text", "two dogs run")
        page.click("#translate-button")
        expect(page.locator(".heatmap")).to_have_count(1)
        browser.close()
    assert sent and (sent[-1]["model"], sent[-1]["source_language"], sent[-1]["target_language"]) == (
        "tiny-m2m",
        "fr",
        "de",
    )
