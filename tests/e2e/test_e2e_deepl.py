"""DeepL's official Python client (``deepl``) against the real service and its default models:
translation with and without a glossary, glossaries created, listed, read and deleted, and its
errors as the client raises them. Kept spans (``/v1/translate``'s ``keep``) come back byte for
byte from the real constrained search."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import deepl
import httpx
import pytest

from tests.e2e.real_models import served_env, start_service
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow
KEY = "e2e-deepl-key"


@pytest.fixture(scope="module")
def keyed_service(
    default_artefacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = served_env(
        default_artefacts,
        "fp32",
        TSERVE_API_KEYS=KEY,
        TSERVE_GLOSSARY_DIR=str(tmp_path_factory.mktemp("glossaries")),
    )
    yield from start_service(tmp_path_factory, "service-deepl", env)


@pytest.fixture
def translator(keyed_service: ServerProcess) -> Iterator[deepl.Translator]:
    client = deepl.Translator(KEY, server_url=keyed_service.url, send_platform_info=False)
    yield client
    for glossary in client.list_glossaries():
        client.delete_glossary(glossary)
    client.close()


def test_translate_without_a_glossary(translator: deepl.Translator) -> None:
    one = translator.translate_text("A man is riding a bicycle.", source_lang="EN", target_lang="DE")
    assert isinstance(one, deepl.TextResult)
    assert "Mann" in one.text and one.detected_source_lang == "EN"
    two = translator.translate_text(
        ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."], target_lang="EN-US"
    )
    assert isinstance(two, list)
    assert [r.detected_source_lang for r in two] == ["DE", "DE"]  # no source_lang: detected per text
    assert "man" in two[0].text.lower() and "snow" in two[1].text.lower()


def test_glossaries_created_listed_read_used_and_deleted(translator: deepl.Translator) -> None:
    entries = {"bicycle": "Drahtesel", "snow": "Pulverschnee"}
    made = translator.create_glossary("captions", "EN", "DE", entries)
    assert (made.source_lang, made.target_lang, made.entry_count, made.ready) == ("EN", "DE", 2, True)
    assert [g.glossary_id for g in translator.list_glossaries()] == [made.glossary_id]
    assert translator.get_glossary(made.glossary_id).name == "captions"
    assert translator.get_glossary_entries(made) == entries
    texts = ["A man is riding a bicycle.", "Two dogs are playing in the snow.", "A woman is reading."]
    plain = translator.translate_text(texts, source_lang="EN", target_lang="DE")
    held = translator.translate_text(texts, source_lang="EN", target_lang="DE", glossary=made)
    assert isinstance(plain, list) and isinstance(held, list)
    assert "Drahtesel" not in plain[0].text and "Drahtesel" in held[0].text
    assert "Pulverschnee" in held[1].text
    assert held[2].text == plain[2].text  # no term in it: translated as without the glossary
    translator.delete_glossary(made)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_glossary(made.glossary_id)


def test_csv_entries_and_the_language_lists(translator: deepl.Translator) -> None:
    made = translator.create_glossary_from_csv("csv", "DE", "EN", csv_data="Fahrrad,bike\nHund,hound\n")
    assert translator.get_glossary_entries(made) == {"Fahrrad": "bike", "Hund": "hound"}
    pairs = {(p.source_lang, p.target_lang) for p in translator.get_glossary_languages()}
    assert pairs == {("en", "de"), ("de", "en")}
    assert {lang.code for lang in translator.get_source_languages()} == {"EN", "DE"}
    assert {lang.code for lang in translator.get_target_languages()} == {"DE", "EN-GB", "EN-US"}
    assert translator.get_usage().character.count is not None


def test_the_clients_errors(translator: deepl.Translator, keyed_service: ServerProcess) -> None:
    with pytest.raises(deepl.DeepLException, match="no model translates en→fr"):
        translator.create_glossary("nope", "EN", "FR", {"a": "b"})
    with pytest.raises(deepl.DeepLException, match="Not found"):
        translator.translate_text("a dog", source_lang="EN", target_lang="DE", glossary="no-such-id")
    with pytest.raises(deepl.DeepLException, match="longer than"):
        translator.create_glossary("long", "EN", "DE", {"x" * 201: "y"})
    wrong = deepl.Translator("wrong-key", server_url=keyed_service.url, send_platform_info=False)
    with pytest.raises(deepl.AuthorizationException):
        wrong.translate_text("a dog", target_lang="DE")
    wrong.close()


@pytest.mark.parametrize(
    ("sentence", "target"),
    [
        ("A man has {count} dogs in ACME\u00a0Cloud™.", "de"),
        ("Ein Mann hat {count} Hunde in ACME\u00a0Cloud™.", "en"),
    ],
)
def test_kept_spans_come_back_byte_for_byte(keyed_service: ServerProcess, sentence: str, target: str) -> None:
    kept = ["{count}", "ACME\u00a0Cloud™"]
    body = {"text": [sentence], "keep": kept, "target_language": target}
    with httpx.Client(
        base_url=keyed_service.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    ) as c:
        r = c.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["translations"][0]["hypotheses"][0]["text"]
    assert all(span in text for span in kept) and "@" not in text  # each placeholder replaced
