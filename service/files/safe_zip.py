"""ZIP archives (Office, ODF, EPUB) opened without trusting them.

Everything that bounds the work is checked from the central directory before a byte is
decompressed: the number of entries, the total uncompressed size, each entry's compression
ratio, names that would leave the archive (absolute, ``..``, backslashes, drive letters) and
encrypted entries. The declared sizes can lie, so reading enforces them again: an entry yields
at most its declared size (zipfile's own bound) and the archive at most its total budget.
``rebuild`` writes the archive back in its order with each entry's compression (EPUB needs its
``mimetype`` first and stored), replacing the translated entries.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass

from service.files.refusals import FileTooLarge, InvalidFile, UnsupportedFile

# Below this size an entry's ratio is not checked: small, very regular XML parts compress well
# and cannot cost much whatever their ratio.
_RATIO_FLOOR_BYTES = 1 << 16
_CHUNK = 1 << 16
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ZipLimits:
    max_entries: int
    max_uncompressed_bytes: int
    max_ratio: float


class Archive:
    """An archive whose central directory passed the checks; ``read`` enforces them again."""

    def __init__(self, data: bytes, limits: ZipLimits, kind: str) -> None:
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            raise UnsupportedFile(f"the file is not a {kind}: it is no ZIP archive ({e})") from e
        self._infos = self._zip.infolist()
        self._by_name: dict[str, zipfile.ZipInfo] = {}
        self._check(limits)
        self._budget = limits.max_uncompressed_bytes

    @property
    def names(self) -> list[str]:
        return [info.filename for info in self._infos]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def read(self, name: str) -> bytes:
        """The entry's bytes, within its declared size and what is left of the archive's budget."""
        info = self._by_name[name]
        out = bytearray()
        try:
            with self._zip.open(info) as stream:
                while chunk := stream.read(_CHUNK):
                    out += chunk
                    if len(out) > self._budget:
                        raise FileTooLarge(
                            "the archive unpacks to more than its declared size",
                            limit=self._budget,
                        )
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as e:
            raise InvalidFile(f"{name}: the archive is damaged ({e})") from e
        self._budget -= len(out)
        return bytes(out)

    def rebuild(self, replaced: dict[str, bytes]) -> bytes:
        """The archive with ``replaced`` entries' new bytes, every entry in its order and with
        its own compression."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as target:
            for info in self._infos:
                data = replaced[info.filename] if info.filename in replaced else self.read(info.filename)
                copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                copy.compress_type = info.compress_type
                copy.external_attr = info.external_attr
                target.writestr(copy, data)
        return out.getvalue()

    def _check(self, limits: ZipLimits) -> None:
        if len(self._infos) > limits.max_entries:
            message = f"the archive has {len(self._infos)} entries, more than {limits.max_entries}"
            raise FileTooLarge(message, limit=limits.max_entries)
        total = sum(info.file_size for info in self._infos)
        if total > limits.max_uncompressed_bytes:
            message = f"the archive unpacks to {total} bytes, more than {limits.max_uncompressed_bytes}"
            raise FileTooLarge(message, limit=limits.max_uncompressed_bytes)
        for info in self._infos:
            name = info.filename
            if _leaves_archive(name):
                raise InvalidFile(f"the archive entry {name!r} names a path outside the archive")
            if name in self._by_name:
                raise InvalidFile(f"the archive holds {name!r} twice")
            if info.flag_bits & 0x1:
                raise InvalidFile(f"the archive entry {name!r} is encrypted")
            ratio = info.file_size / max(1, info.compress_size)
            if info.file_size > _RATIO_FLOOR_BYTES and ratio > limits.max_ratio:
                message = (
                    f"the archive entry {name!r} would unpack {ratio:.0f} times its size, "
                    f"more than {limits.max_ratio:g}"
                )
                raise FileTooLarge(message, limit=limits.max_ratio)
            self._by_name[name] = info


def _leaves_archive(name: str) -> bool:
    parts = name.split("/")
    return (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or bool(_DRIVE.match(name))
        or any(part == ".." for part in parts)
    )
