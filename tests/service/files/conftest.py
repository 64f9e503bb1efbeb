"""The app over the small engines (ReverseTranslator: a sentence's words reversed), with limits
that let the test files through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.service.api.conftest import Served, serving, small_settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def file_settings(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "max_body_bytes": 1 << 20,
        "max_chars_per_text": 20_000,
        "max_translate_chars_per_request": 20_000,
        **overrides,
    }
    return small_settings(**values)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving(file_settings()) as s:
        yield s


def reversed_words(sentence: str) -> str:
    """What the small translator answers for one sentence: its words reversed, the first of
    them upper-cased (its best hypothesis)."""
    words = sentence.split()[::-1]
    return " ".join([words[0].upper(), *words[1:]]) if words else ""


async def translate_v1(client: httpx.AsyncClient, name: str, data: bytes, **form: str) -> httpx.Response:
    return await client.post(
        "/v1/translate/file", files={"file": (name, data)}, data={"target_language": "de", **form}
    )
