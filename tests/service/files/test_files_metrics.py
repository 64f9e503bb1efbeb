"""File translation in the metrics: each file counted by its format and outcome (ok, or the
refusal's error type) and its size observed, through both file routes; a name no format reads is
"other", so the labels stay the registry's formats whatever the clients upload."""

from __future__ import annotations

import pytest

from tests.service.api.conftest import Served, metric, serving
from tests.service.files import documents
from tests.service.files.conftest import file_settings, translate_v1

pytestmark = pytest.mark.anyio


def files(fmt: str, outcome: str) -> float:
    return metric("tserve_files_total", format=fmt, outcome=outcome)


def file_bytes(fmt: str) -> tuple[float, float]:
    """The histogram's count and sum of ``fmt``'s files."""
    return metric("tserve_file_bytes_count", format=fmt), metric("tserve_file_bytes_sum", format=fmt)


async def test_a_translated_file_is_counted_ok_with_its_size(served: Served) -> None:
    data = documents.docx([[("Two dogs play.", False)]])
    before, (count, total) = files("docx", "ok"), file_bytes("docx")
    response = await translate_v1(served.client, "letter.docx", data)
    assert response.status_code == 200, response.text
    assert files("docx", "ok") - before == 1
    assert file_bytes("docx") == (count + 1, total + len(data))


async def test_libretranslates_route_is_counted_too(served: Served) -> None:
    before = files("md", "ok")
    response = await served.client.post(
        "/translate_file",
        files={"file": ("notes.md", b"# A title\n\nA dog runs.\n")},
        data={"source": "en", "target": "de"},
    )
    assert response.status_code == 200, response.text
    assert files("md", "ok") - before == 1


async def test_refusals_are_counted_by_their_error_type(served: Served) -> None:
    not_srt = files("srt", "unsupported_file")
    unknown = files("other", "unsupported_file")
    response = await translate_v1(served.client, "film.srt", b"just some words\n")
    assert response.status_code == 415
    response = await translate_v1(served.client, "tool.exe", b"MZ")
    assert response.status_code == 415
    assert files("srt", "unsupported_file") - not_srt == 1
    assert files("other", "unsupported_file") - unknown == 1
    assert files("exe", "unsupported_file") == 0  # never a label from the client's name


async def test_an_oversized_file_is_counted_as_too_large_with_its_size() -> None:
    async with serving(file_settings(max_file_bytes=64)) as served:
        before, (count, _) = files("txt", "file_too_large"), file_bytes("txt")
        response = await translate_v1(served.client, "long.txt", b"A dog runs. " * 10)
        assert response.status_code == 413
        assert files("txt", "file_too_large") - before == 1
        assert file_bytes("txt")[0] == count + 1
