"""Glossaries kept on disk, one JSON file each, under ``Settings.glossary_dir``.

Each glossary belongs to the API key that created it (kept as the key's SHA-256, never the key):
a key sees, uses and deletes only its own; with API keys off, every glossary belongs to no key
and all requests share them. The limits bound a glossary's entries and terms, and all
glossaries together (their count and their files' bytes), whichever key made them.

Writes are atomic: a glossary is written to a temporary file in the same directory, flushed to
disk and renamed over its name, so a crash leaves the old file or the new one, never half of
one; ``_lock`` makes each check-and-write one step, so concurrent creations lose nothing and
together never pass a limit. The directory is read once, at start: one process per directory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from service.glossaries.entries import Entry, GlossaryProblem, checked_entries
from service.glossaries.matching import TermMatcher
from service.settings import Settings


@dataclass(frozen=True)
class GlossaryLimits:
    max_entries: int  # per glossary
    max_term_chars: int  # per source or target term
    max_glossaries: int  # all keys together
    max_total_bytes: int  # every glossary's file together


def glossary_limits(settings: Settings) -> GlossaryLimits:
    return GlossaryLimits(
        max_entries=settings.glossary_max_entries,
        max_term_chars=settings.glossary_max_term_chars,
        max_glossaries=settings.glossary_max_count,
        max_total_bytes=settings.glossary_max_total_bytes,
    )


@dataclass(frozen=True)
class Glossary:
    id: str
    name: str
    source_language: str
    target_language: str
    entries: tuple[Entry, ...]
    created_at: str  # ISO 8601, UTC
    owner: str  # the creating key's SHA-256 ("" with API keys off)

    @functools.cached_property
    def matcher(self) -> TermMatcher:
        return TermMatcher(self.entries)


class GlossaryNotFound(LookupError):
    """No glossary of this id (or name) that the key may see."""


class GlossaryFull(GlossaryProblem):
    """The glossaries' count or bytes would pass their limit (deleting some makes room)."""


class GlossaryExists(GlossaryProblem):
    """A glossary of this name for this language pair is the key's already."""


def owner_of(api_key: str | None) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


class GlossaryStore:
    def __init__(self, directory: Path, limits: GlossaryLimits) -> None:
        self.directory = directory
        self.limits = limits
        self._lock = threading.Lock()
        self._glossaries: dict[str, Glossary] = {}
        self._bytes: dict[str, int] = {}
        if directory.is_dir():
            for path in sorted(directory.glob("*.json")):
                glossary = _read(path)
                self._glossaries[glossary.id] = glossary
                self._bytes[glossary.id] = path.stat().st_size

    def create(
        self, api_key: str | None, name: str, source: str, target: str, entries: Sequence[Entry]
    ) -> Glossary:
        """A new glossary, written to disk; ``GlossaryProblem`` (or its ``GlossaryFull``,
        ``GlossaryExists``) when it cannot be kept."""
        limits = self.limits
        glossary = Glossary(
            id=str(uuid.uuid4()),
            name=name,
            source_language=source,
            target_language=target,
            entries=checked_entries(entries, limits.max_entries, limits.max_term_chars),
            created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            owner=owner_of(api_key),
        )
        content = _serialised(glossary)
        with self._lock:
            if self._named(glossary.owner, name, source, target) is not None:
                message = f"a glossary named {name!r} for {source}→{target} exists already"
                raise GlossaryExists(message, "name")
            if len(self._glossaries) >= limits.max_glossaries:
                raise GlossaryFull(
                    f"the service holds its limit of {limits.max_glossaries} glossaries: delete some first",
                    limit=limits.max_glossaries,
                )
            if sum(self._bytes.values()) + len(content) > limits.max_total_bytes:
                raise GlossaryFull(
                    f"this glossary ({len(content)} bytes) would take the glossaries past their "
                    f"limit of {limits.max_total_bytes} bytes: delete some first",
                    limit=limits.max_total_bytes,
                )
            _write_atomically(self.directory, f"{glossary.id}.json", content)
            self._glossaries[glossary.id] = glossary
            self._bytes[glossary.id] = len(content)
        return glossary

    def list(self, api_key: str | None) -> list[Glossary]:
        """The key's glossaries, oldest first."""
        owner = owner_of(api_key)
        mine = [g for g in list(self._glossaries.values()) if g.owner == owner]  # a copy, as in _named
        return sorted(mine, key=lambda g: (g.created_at, g.id))

    def get(self, api_key: str | None, glossary_id: str) -> Glossary:
        found = self._glossaries.get(glossary_id)
        if found is None or found.owner != owner_of(api_key):
            raise GlossaryNotFound(f"no glossary with id {glossary_id!r}")
        return found

    def find(self, api_key: str | None, reference: str, source: str, target: str) -> Glossary:
        """The key's glossary of id ``reference``, else the one named ``reference`` for
        ``source`` → ``target``."""
        try:
            return self.get(api_key, reference)
        except GlossaryNotFound:
            pass
        named = self._named(owner_of(api_key), reference, source, target)
        if named is not None:
            return named
        raise GlossaryNotFound(f"no glossary with id {reference!r}, nor named so for {source}→{target}")

    def _named(self, owner: str, name: str, source: str, target: str) -> Glossary | None:
        wanted = (owner, name, source, target)
        for g in list(self._glossaries.values()):  # a copy: another thread may add one meanwhile
            if (g.owner, g.name, g.source_language, g.target_language) == wanted:
                return g
        return None

    def delete(self, api_key: str | None, glossary_id: str) -> None:
        with self._lock:
            self.get(api_key, glossary_id)
            (self.directory / f"{glossary_id}.json").unlink(missing_ok=True)
            del self._glossaries[glossary_id]
            del self._bytes[glossary_id]


def _serialised(glossary: Glossary) -> bytes:
    fields = {k: v for k, v in asdict(glossary).items() if k != "entries"}
    fields["entries"] = [asdict(e) for e in glossary.entries]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def _read(path: Path) -> Glossary:
    fields = json.loads(path.read_text(encoding="utf-8"))
    fields["entries"] = tuple(Entry(**e) for e in fields["entries"])
    return Glossary(**fields)


def _write_atomically(directory: Path, name: str, content: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, directory / name)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)
