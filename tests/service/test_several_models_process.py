"""``python -m service`` with two real exported translators (tiny en→de and de→en) and an
embedder, configured by TSERVE_TRANSLATE_MODELS alone: loading, readiness, routing over HTTP,
the engines' per-model token counters, and the process's RSS (printed for the report)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess, artefact_env, server_process, service_command


@pytest.fixture(scope="module")
def de_en_artefact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model whose name makes its manifest say de→en (as the export reads names)."""
    pytest.importorskip("torch")
    from export.translation import export_translation
    from tests.tiny_models import few_reference_sentences, tiny_translation_checkpoint

    checkpoint = tiny_translation_checkpoint(tmp_path_factory.mktemp("checkpoints") / "tiny-de-en", seed=1)
    reference = few_reference_sentences(tmp_path_factory.mktemp("reference") / "reference.txt")
    (directory,) = export_translation(
        checkpoint, tmp_path_factory.mktemp("artefacts"), ["fp32"], reference=reference
    )
    return directory


@pytest.fixture(scope="module")
def server(
    translation_artefact: Path,
    embedding_artefact: Path,
    de_en_artefact: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("served-artefacts")
    for artefact in (translation_artefact, de_en_artefact, embedding_artefact):
        (root / artefact.parent.name).symlink_to(artefact.parent, target_is_directory=True)
    env = artefact_env(root)
    del env["TSERVE_TRANSLATE_MODEL"]
    env["TSERVE_TRANSLATE_MODELS"] = "tiny-en-de,tiny-de-en"
    with server_process(service_command(), env, tmp_path_factory.mktemp("server") / "server.log") as s:
        yield s


def test_both_translators_are_loaded_and_listed(server: ServerProcess) -> None:
    ready = httpx.get(f"{server.url}/health/ready").json()
    assert ready["status"] == "ready" and ready["models"] == ["tiny-en-de", "tiny-de-en", "tiny-bert"]
    cards = {c["id"]: c for c in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert (cards["tiny-de-en"]["source_languages"], cards["tiny-de-en"]["target_languages"]) == (
        ["de"],
        ["en"],
    )
    languages = {entry["code"]: entry["targets"] for entry in httpx.get(f"{server.url}/languages").json()}
    assert languages == {"en": ["de"], "de": ["en"]}
    print(f"RSS with two tiny translators and a tiny embedder: {server.rss_bytes() / 2**20:.1f} MiB")


def test_requests_go_to_the_model_of_their_pair(server: ServerProcess) -> None:
    before = {m: server.metric("tserve_input_tokens_total", model=m) for m in ("tiny-en-de", "tiny-de-en")}
    r = httpx.post(
        f"{server.url}/v1/translate", json={"text": "a man rides", "source_language": "de"}, timeout=30
    )
    assert r.status_code == 200 and r.json()["model"] == "tiny-de-en", r.text
    r = httpx.post(
        f"{server.url}/translate", json={"q": "two dogs run", "source": "de", "target": "en"}, timeout=30
    )
    assert r.status_code == 200 and r.json()["translatedText"], r.text
    assert server.metric("tserve_input_tokens_total", model="tiny-de-en") > before["tiny-de-en"]
    assert server.metric("tserve_input_tokens_total", model="tiny-en-de") == before["tiny-en-de"]
    r = httpx.post(f"{server.url}/v1/translate", json={"text": "a", "target_language": "fr"}, timeout=30)
    assert r.status_code == 422 and "served pairs: en→de, de→en" in r.text
