"""Hostile files get a clear 4xx before any of them is translated, in bounded time and memory:
zip bombs (too many entries, too much to unpack, a ratio no document has, sizes that lie), XML
entity expansion and external entities, archive names that leave the archive, content that is
not what its extension says, and files over the size limit."""

from __future__ import annotations

import io
import struct
import time
import zipfile
from collections.abc import AsyncIterator

import pytest

from tests.service.api.conftest import Served, serving
from tests.service.files.conftest import file_settings
from tests.service.files.documents import W, archive, docx

pytestmark = pytest.mark.anyio

_CONTENT_TYPES = ("[Content_Types].xml", b"<?xml version='1.0'?><Types/>")
_DOCUMENT = (
    f"<w:document xmlns:w='{W}'><w:body><w:p><w:r><w:t>Two dogs.</w:t></w:r></w:p></w:body></w:document>"
)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    settings = file_settings(
        max_file_bytes=64 << 10,
        max_archive_entries=16,
        max_archive_uncompressed_bytes=8 << 20,
        max_archive_ratio=100,
    )
    async with serving(settings) as s:
        yield s


async def _refused(served: Served, name: str, data: bytes, status: int, words: str) -> None:
    """Refused with ``status`` naming ``words``, on both routes, quickly and before the model."""
    started = time.monotonic()
    v1 = await served.client.post(
        "/v1/translate/file", files={"file": (name, data)}, data={"target_language": "de"}
    )
    libre = await served.client.post(
        "/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "de"}
    )
    assert time.monotonic() - started < 5
    assert v1.status_code == status, v1.text
    assert words in v1.json()["error"]["message"]
    assert libre.status_code == status and set(libre.json()) == {"error"}, libre.text
    assert words in libre.json()["error"]
    assert served.translator.hooks.batches == []  # nothing reached the model


def _docx_with(*entries: tuple[str, bytes]) -> bytes:
    return archive([_CONTENT_TYPES, ("word/document.xml", _DOCUMENT.encode()), *entries])


async def test_too_many_entries(served: Served) -> None:
    bomb = _docx_with(*[(f"word/media/{i}.bin", b"x") for i in range(20)])
    await _refused(served, "bomb.docx", bomb, 413, "entries, more than 16")


async def test_too_much_to_unpack_is_refused_from_the_directory(served: Served) -> None:
    entries = [(f"word/media/{i}.bin", bytes(range(256)) * 4096 * 3) for i in range(4)]  # 12 MiB
    await _refused(served, "big.docx", _docx_with(*entries), 413, "unpacks to")


async def test_a_compression_ratio_no_document_has(served: Served) -> None:
    bomb = _docx_with(("word/media/zeros.bin", bytes(4 << 20)))  # 4 MiB of zeros: ~1000:1
    assert len(bomb) < 64 << 10
    await _refused(served, "ratio.docx", bomb, 413, "times its size")


def _lying(data: bytes, name: str, declared: int) -> bytes:
    """``data`` with ``name``'s uncompressed size declared as ``declared`` in both headers."""
    out = bytearray(data)
    encoded = name.encode()
    for signature, size_at, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        at = out.find(signature)
        while at >= 0:
            length = struct.unpack_from("<H", out, at + (26 if signature == b"PK\x03\x04" else 28))[0]
            if bytes(out[at + name_at : at + name_at + length]) == encoded:
                struct.pack_into("<I", out, at + size_at, declared)
            at = out.find(signature, at + 4)
    return bytes(out)


async def test_sizes_that_lie_are_enforced_while_reading(served: Served) -> None:
    honest = _docx_with(("word/document.xml.rels", b"a" * 50_000))
    # the document part itself declares 10 bytes: reading stops there and the archive is damaged
    lying = _lying(honest, "word/document.xml", 10)
    with zipfile.ZipFile(io.BytesIO(lying)) as z:
        assert z.getinfo("word/document.xml").file_size == 10
    await _refused(served, "lying.docx", lying, 422, "damaged")


async def test_entity_expansion_is_refused(served: Served) -> None:
    laughs = (
        "<?xml version='1.0'?><!DOCTYPE w:document [<!ENTITY a 'haha'>"
        + "".join(f"<!ENTITY {chr(98 + i)} '{('&' + chr(97 + i) + ';') * 10}'>" for i in range(8))
        + f"]><w:document xmlns:w='{W}'><w:body><w:p><w:r><w:t>&i;</w:t></w:r></w:p></w:body></w:document>"
    )
    await _refused(served, "laughs.docx", docx([], document_xml=laughs.encode()), 422, "entity")


async def test_external_entities_are_refused(served: Served) -> None:
    xxe = (
        "<?xml version='1.0'?><!DOCTYPE w:document [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>"
        f"<w:document xmlns:w='{W}'><w:body><w:p><w:r><w:t>&e;</w:t></w:r></w:p></w:body></w:document>"
    )
    await _refused(served, "xxe.docx", docx([], document_xml=xxe.encode()), 422, "entity")


@pytest.mark.parametrize("name", ["../../etc/cron.d/evil", "/etc/passwd", "word\\..\\..\\evil", "C:/evil"])
async def test_names_that_leave_the_archive(served: Served, name: str) -> None:
    await _refused(served, "traversal.docx", _docx_with((name, b"x")), 422, "outside the archive")


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("report.docx", b"Just some text, no archive.", "no ZIP archive"),
        ("book.epub", _docx_with(), "not an EPUB"),
        ("notes.txt", b"MZ\x90\x00\x03\x00\x00\x00", "NUL bytes"),
        ("notes.txt", "Grüße".encode("latin-1"), "not UTF-8"),
        ("film.srt", b"no timings here\n", "SubRip"),
        ("program.exe", b"MZ", "not translated"),
    ],
)
async def test_content_that_is_not_its_extension(served: Served, name: str, data: bytes, words: str) -> None:
    await _refused(served, name, data, 415, words)


async def test_a_file_over_the_limit(served: Served) -> None:
    await _refused(served, "big.txt", b"Two dogs play.\n" * 5000, 413, "more than 65536")


async def test_a_body_over_the_body_limit_is_cut_off() -> None:
    async with serving(file_settings(max_body_bytes=4096)) as served:
        response = await served.client.post(
            "/v1/translate/file", files={"file": ("big.txt", b"x" * 10_000)}, data={"target_language": "de"}
        )
        assert response.status_code == 413
        libre = await served.client.post(
            "/translate_file",
            files={"file": ("big.txt", b"x" * 10_000)},
            data={"source": "en", "target": "de"},
        )
        assert libre.status_code == 413 and set(libre.json()) == {"error"}


async def test_a_harmless_file_passes_the_same_checks(served: Served) -> None:
    response = await served.client.post(
        "/v1/translate/file",
        files={"file": ("fine.docx", _docx_with(("word/media/a.bin", b"a" * 1000)))},
        data={"target_language": "de"},
    )
    assert response.status_code == 200, response.text
