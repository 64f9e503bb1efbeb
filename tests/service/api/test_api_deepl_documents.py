"""DeepL's document API (/v2/document) driven by the official ``deepl`` client against a live server:
.txt, .docx, .pptx and .html, a glossary, and its errors (another key's document, a wrong
document key, a flood of uploads)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepl
import httpx
import pytest

from tests.servers import ServerProcess, server_process, small_server_command
from tests.service.files.documents import docx, pptx


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {
        "TSERVE_API_KEYS": '["k1", "k2"]',
        "TSERVE_MAX_DOCUMENTS_IN_FLIGHT": "2",
        "TSERVE_MAX_WAIT_MS": "1",
    }
    directory = tmp_path_factory.mktemp("deepl-documents")
    env["TSERVE_GLOSSARY_DIR"] = str(directory / "glossaries")
    log = directory / "server.log"
    with server_process(small_server_command(delay_s=0.3), env, log) as served:
        yield served


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client polls every 5 s; the small engines finish in milliseconds."""
    monkeypatch.setattr(deepl.translator.time, "sleep", lambda s: None)


def translator(server: ServerProcess, key: str = "k1") -> deepl.Translator:
    return deepl.Translator(key, server_url=server.url)


def translated(
    server: ServerProcess, tmp_path: Path, name: str, data: bytes, glossary: str | None = None
) -> bytes:
    source, out = tmp_path / name, tmp_path / f"out-{name}"
    source.write_bytes(data)
    translator(server).translate_document_from_filepath(
        source,
        out,
        target_lang="DE",
        source_lang="EN",
        glossary=glossary,  # a few words tell no language
    )
    return out.read_bytes()


def test_txt_and_html(server: ServerProcess, tmp_path: Path) -> None:
    assert translated(server, tmp_path, "a.txt", b"two dogs run\n\nA cat\n") == b"RUN dogs two\n\nCAT A\n"
    html = translated(server, tmp_path, "a.html", b"<p>two dogs</p><b>a cat</b>")
    assert html == b"<p>DOGS two</p><b>CAT a</b>"


def test_office_documents_keep_their_parts(server: ServerProcess, tmp_path: Path) -> None:
    for name, data, part, words in (
        ("r.docx", docx([[("two dogs", True), (" run", False)]]), "word/document.xml", b"RUN dogs two"),
        ("s.pptx", pptx([[[("a cat", False)]]]), "ppt/slides/slide1.xml", b"CAT a"),
    ):
        out = translated(server, tmp_path, name, data)
        with zipfile.ZipFile(io.BytesIO(out)) as got, zipfile.ZipFile(io.BytesIO(data)) as sent:
            assert got.namelist() == sent.namelist()
            assert words in got.read(part)
            assert b"<w:b/>" in got.read(part) or name.endswith(".pptx")  # the bold run kept


def test_a_glossary_is_the_keys_own(server: ServerProcess, tmp_path: Path) -> None:
    """The small translator ignores terms (the constrained search is tested on real models): here
    the glossary is taken, and another key's is refused."""
    glossary = translator(server).create_glossary("docs", "EN", "DE", {"dogs": "Hunde"})
    assert translated(server, tmp_path, "g.txt", b"two dogs", glossary=glossary.glossary_id) == b"DOGS two"
    handle = translator(server, "k2").translate_document_upload(
        b"two dogs", target_lang="DE", source_lang="EN", filename="g.txt", glossary=glossary.glossary_id
    )
    status = translator(server, "k2").translate_document_wait_until_done(handle)
    assert not status.ok and "glossary" in str(status.error_message)


def test_another_key_and_a_wrong_document_key_are_refused(server: ServerProcess) -> None:
    handle = translator(server).translate_document_upload(
        b"a cat", target_lang="DE", source_lang="EN", filename="c.txt"
    )
    with pytest.raises(deepl.DeepLException, match="not found"):
        translator(server, "k2").translate_document_get_status(handle)
    wrong = deepl.DocumentHandle(handle.document_id, "0" * 64)
    with pytest.raises(deepl.AuthorizationException):
        translator(server).translate_document_get_status(wrong)
    assert translator(server).translate_document_wait_until_done(handle).done


def test_a_flood_of_uploads_gets_429_and_loses_nothing(server: ServerProcess) -> None:
    files = {"file": ("f.txt", b"word " * 50)}
    headers = {"Authorization": "DeepL-Auth-Key k1"}
    form = {"target_lang": "DE", "source_lang": "EN"}
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{server.url}/v2/document", data=form, files=files, headers=headers),
                range(8),
            )
        )
    assert {a.status_code for a in answers} == {200, 429}, [a.text for a in answers]
    client = translator(server)
    for accepted in (a.json() for a in answers if a.status_code == 200):
        handle = deepl.DocumentHandle(accepted["document_id"], accepted["document_key"])
        assert client.translate_document_wait_until_done(handle).done


def test_bad_uploads_get_deepls_errors(server: ServerProcess) -> None:
    headers = {"Authorization": "DeepL-Auth-Key k1"}
    post = lambda **kw: httpx.post(f"{server.url}/v2/document", headers=headers, **kw)  # noqa: E731
    assert post(data={"target_lang": "DE"}).status_code == 400  # no file
    assert post(data={"target_lang": "DE"}, files={"file": ("a.exe", b"x")}).status_code == 415
    converted = post(data={"target_lang": "DE", "output_format": "pdf"}, files={"file": ("a.txt", b"x")})
    assert converted.status_code == 400 and "message" in converted.json()
