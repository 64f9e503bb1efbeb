"""Glossaries kept on disk, one JSON file each, under ``Settings.glossary_dir``, shared by every
process serving from that directory (a server's processes, or pods on one ReadWriteMany volume).

Each glossary belongs to the API key that created it (kept as the key's SHA-256, never the key):
a key sees, uses and deletes only its own; with API keys off, every glossary belongs to no key
and all requests share them. The limits bound a glossary's entries and terms, and all
glossaries together (their count and their files' bytes), whichever key made them.

Writes are atomic: a glossary is written to a temporary dot file in the same directory, flushed
to disk and renamed over its name, so a crash leaves the old file or the new one, never half of
one, and no reader ever sees a file being written. A creation or deletion is one step across
processes: an exclusive ``flock`` on the directory's ``.lock`` spans listing, checking (name,
count, bytes) and writing, so racing creations lose nothing and together never pass a limit.

Each process keeps the glossaries in memory and brings them up to date before every lookup:
glossary files are only ever created or removed (a rename, an unlink), each of which changes the
directory's mtime, so one stat of the directory says whether to list it again; a listing stats
each file and reads only those new or changed (inode, mtime, size) since. A directory changed
less than ``_SETTLING_NS`` before it was listed is listed again at each lookup until it is older,
as two changes within one tick of its timestamps would look like one. A file that does not parse (copied
in by hand, cut short) is skipped with a warning and read again once it changes. An id the
listing lacks is looked up by its file's name: NFS clients cache a directory's attributes for
seconds, so lists may lag another pod's changes (k8s/README.md), but an id just created works.

Why a locked directory: it needs nothing beyond a volume the pods mount. SQLite on a shared
volume relies on byte-range locks and page caching that network file systems get wrong (its own
documentation advises against it), and a database or Redis is one more service to run, secure
and back up for a few megabytes of glossaries.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from service.glossaries.entries import Entry, GlossaryProblem, checked_entries
from service.glossaries.matching import TermMatcher
from service.settings import Settings

log = logging.getLogger(__name__)

_LOCK_FILE = ".lock"  # a dot file: never taken for a glossary
# Some file systems keep whole seconds (and NFS stamps with the server's clock): a directory
# changed less than this before it was listed may have changed again within the same stamp.
_SETTLING_NS = 2_000_000_000


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


class _Stamp(NamedTuple):
    """A file as stat saw it: a file replaced or rewritten has another."""

    inode: int
    mtime_ns: int
    size: int


class GlossaryStore:
    def __init__(self, directory: Path, limits: GlossaryLimits) -> None:
        self.directory = directory
        self.limits = limits
        # This process's creations and deletions, one at a time: flock alone would not do it
        # where it is emulated by POSIX locks (NFS), which a process's threads all hold at once.
        self._writing = threading.Lock()
        # What follows, read and brought up to date by one thread at a time.
        self._reading = threading.Lock()
        self._stamps: dict[str, _Stamp] = {}  # every glossary file seen, by id (its name's stem)
        self._glossaries: dict[str, Glossary] = {}  # those that parsed
        self._listed: tuple[int, int] | None = None  # the directory's stamp, when its listing holds
        self._refresh()

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
        with self._writing, _locked(self.directory):
            with self._reading:
                # Listed whatever the directory's stamp says (NFS may cache it): the checks
                # must count every file, and a listing is little next to a write.
                self._refresh(listing=True)
                self._check_room_for(glossary, len(content))
            path = _write_atomically(self.directory, f"{glossary.id}.json", content)
            with self._reading:
                self._stamps[glossary.id] = _stamp(path.stat())
                self._glossaries[glossary.id] = glossary
        return glossary

    def _check_room_for(self, glossary: Glossary, size: int) -> None:
        limits = self.limits
        named = self._named(glossary.owner, glossary.name, glossary.source_language, glossary.target_language)
        if named is not None:
            pair = f"{glossary.source_language}→{glossary.target_language}"
            raise GlossaryExists(f"a glossary named {glossary.name!r} for {pair} exists already", "name")
        if len(self._glossaries) >= limits.max_glossaries:
            raise GlossaryFull(
                f"the service holds its limit of {limits.max_glossaries} glossaries: delete some first",
                limit=limits.max_glossaries,
            )
        if sum(self._stamps[i].size for i in self._glossaries) + size > limits.max_total_bytes:
            raise GlossaryFull(
                f"this glossary ({size} bytes) would take the glossaries past their "
                f"limit of {limits.max_total_bytes} bytes: delete some first",
                limit=limits.max_total_bytes,
            )

    def list(self, api_key: str | None) -> list[Glossary]:
        """The key's glossaries, oldest first."""
        owner = owner_of(api_key)
        with self._reading:
            self._refresh()
            mine = [g for g in self._glossaries.values() if g.owner == owner]
        return sorted(mine, key=lambda g: (g.created_at, g.id))

    def get(self, api_key: str | None, glossary_id: str) -> Glossary:
        with self._reading:
            self._refresh()
            found = self._owned(owner_of(api_key), glossary_id)
        if found is None:
            raise GlossaryNotFound(f"no glossary with id {glossary_id!r}")
        return found

    def find(self, api_key: str | None, reference: str, source: str, target: str) -> Glossary:
        """The key's glossary of id ``reference``, else the one named ``reference`` for
        ``source`` → ``target``."""
        owner = owner_of(api_key)
        with self._reading:
            self._refresh()
            found = self._owned(owner, reference) or self._named(owner, reference, source, target)
        if found is None:
            raise GlossaryNotFound(f"no glossary with id {reference!r}, nor named so for {source}→{target}")
        return found

    def delete(self, api_key: str | None, glossary_id: str) -> None:
        with self._writing, _locked(self.directory):
            self.get(api_key, glossary_id)
            (self.directory / f"{glossary_id}.json").unlink(missing_ok=True)
            with self._reading:
                self._forget(glossary_id)

    # The view below is read and changed under ``_reading``, brought up to date by ``_refresh``.

    def _owned(self, owner: str, glossary_id: str) -> Glossary | None:
        found = self._glossaries.get(glossary_id)
        if found is None and glossary_id not in self._stamps:
            found = self._unlisted(glossary_id)
        return found if found is not None and found.owner == owner else None

    def _named(self, owner: str, name: str, source: str, target: str) -> Glossary | None:
        wanted = (owner, name, source, target)
        for g in self._glossaries.values():
            if (g.owner, g.name, g.source_language, g.target_language) == wanted:
                return g
        return None

    def _refresh(self, *, listing: bool = False) -> None:
        """Lists the directory when its stamp changed since its last listing (or ``listing``),
        reading the files new or changed and forgetting those gone."""
        stamp = _directory_stamp(self.directory)  # before the listing: a change during it shows
        if stamp is not None and stamp == self._listed and not listing:
            return
        listed_at = time.time_ns()
        files = _listing(self.directory)
        for gone in self._stamps.keys() - files.keys():
            self._forget(gone)
        for glossary_id, file_stamp in files.items():
            if self._stamps.get(glossary_id) != file_stamp:
                self._load(glossary_id, file_stamp)
        settled = stamp is not None and stamp[1] < listed_at - _SETTLING_NS
        # A file that did not parse may be rewritten in place, which leaves the directory's stamp
        # as it was: list again each time until it parses or goes.
        self._listed = stamp if settled and len(self._glossaries) == len(self._stamps) else None

    def _unlisted(self, glossary_id: str) -> Glossary | None:
        """The glossary of this id from its file, which the last listing did not show."""
        if not _is_glossary_id(glossary_id):  # nor a path out of the directory
            return None
        try:
            stamp = _stamp((self.directory / f"{glossary_id}.json").stat())
        except FileNotFoundError:
            return None
        self._load(glossary_id, stamp)
        return self._glossaries.get(glossary_id)

    def _load(self, glossary_id: str, stamp: _Stamp) -> None:
        path = self.directory / f"{glossary_id}.json"
        self._stamps[glossary_id] = stamp
        try:
            self._glossaries[glossary_id] = _read(path, glossary_id)
        except FileNotFoundError:  # deleted since it was listed
            self._forget(glossary_id)
        except (OSError, ValueError, TypeError, KeyError) as e:
            self._glossaries.pop(glossary_id, None)
            log.warning("%s is not a glossary, skipped until it changes: %r", path, e)

    def _forget(self, glossary_id: str) -> None:
        self._stamps.pop(glossary_id, None)
        self._glossaries.pop(glossary_id, None)


def _is_glossary_id(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def _stamp(stat: os.stat_result) -> _Stamp:
    return _Stamp(stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _directory_stamp(directory: Path) -> tuple[int, int] | None:
    try:
        stat = directory.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _listing(directory: Path) -> dict[str, _Stamp]:
    """The stamp of each glossary file by id: ``*.json``, leaving out dot files (temporary
    files being written, the lock)."""
    files: dict[str, _Stamp] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(".json") and not entry.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):  # deleted since listed
                        files[entry.name.removesuffix(".json")] = _stamp(entry.stat())
    except FileNotFoundError:  # no glossary created yet
        pass
    return files


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Holds the directory's lock, exclusive among every process using it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _serialised(glossary: Glossary) -> bytes:
    fields = {k: v for k, v in asdict(glossary).items() if k != "entries"}
    fields["entries"] = [asdict(e) for e in glossary.entries]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def _read(path: Path, glossary_id: str) -> Glossary:
    fields = json.loads(path.read_text(encoding="utf-8"))
    fields["entries"] = tuple(Entry(**e) for e in fields["entries"])
    glossary = Glossary(**fields)
    if glossary.id != glossary_id:
        raise ValueError(f"its id is {glossary.id!r}")
    return glossary


def _write_atomically(directory: Path, name: str, content: bytes) -> Path:
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    path = directory / name
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)
    return path
