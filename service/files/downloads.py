"""Translated files waiting for their download (LibreTranslate's ``/translate_file`` answers a
URL, not the file).

Kept in memory, as the service runs on read-only roots: each file for ``ttl_s``, all of them
within ``max_bytes`` (the oldest dropped first to make room). A name is a random token plus the
uploaded name, so one client cannot guess another's file.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from service.files.refusals import FileTooLarge

_TOKEN_HEX_BYTES = 16
_KEPT_NAME_CHARS = 200
# A download name: the token's hex, a dot, the kept name. Longer paths are refused unread.
STORED_NAME_MAX_CHARS = 2 * _TOKEN_HEX_BYTES + 1 + _KEPT_NAME_CHARS


@dataclass(frozen=True)
class StoredFile:
    filename: str
    media_type: str
    data: bytes
    expires_at: float


class TranslatedFiles:
    def __init__(self, ttl_s: float, max_bytes: int) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, StoredFile] = OrderedDict()
        self._bytes = 0

    def put(self, filename: str, media_type: str, data: bytes) -> str:
        """The name to download it by."""
        if len(data) > self.max_bytes:
            message = f"the translated file has {len(data)} bytes, more than the {self.max_bytes} kept"
            raise FileTooLarge(message, limit=self.max_bytes)
        self._expire()
        while self._bytes + len(data) > self.max_bytes:
            self._drop(next(iter(self._files)))
        name = f"{secrets.token_hex(_TOKEN_HEX_BYTES)}.{_safe(filename)}"
        self._files[name] = StoredFile(filename, media_type, data, time.monotonic() + self.ttl_s)
        self._bytes += len(data)
        return name

    def get(self, name: str) -> StoredFile | None:
        self._expire()
        return self._files.get(name)

    def _expire(self) -> None:
        now = time.monotonic()
        for name in [n for n, f in self._files.items() if f.expires_at <= now]:
            self._drop(name)

    def _drop(self, name: str) -> None:
        self._bytes -= len(self._files.pop(name).data)


def _safe(filename: str) -> str:
    """The uploaded name's last part, in characters safe in a URL path and a header, and short
    enough for a download name (its end kept: the extension)."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    kept = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in base)
    return kept.lstrip(".")[-_KEPT_NAME_CHARS:] or "file"
