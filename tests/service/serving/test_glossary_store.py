"""Glossaries on disk: kept across a restart, written atomically, bounded, per API key, and
shared by every process (every store) on one directory."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from service.glossaries import store as store_module
from service.glossaries.entries import Entry, GlossaryProblem
from service.glossaries.store import (
    GlossaryExists,
    GlossaryFull,
    GlossaryLimits,
    GlossaryNotFound,
    GlossaryStore,
)

LIMITS = GlossaryLimits(max_entries=100, max_term_chars=50, max_glossaries=1000, max_total_bytes=1 << 20)
ENTRIES = [Entry("cart", "Warenkorb"), Entry("sign in", "Anmelden", case_sensitive=False)]


def test_a_restart_keeps_every_glossary(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, LIMITS)
    made = store.create("key-a", "shop", "en", "de", ENTRIES)
    reopened = GlossaryStore(tmp_path, LIMITS)
    assert reopened.get("key-a", made.id) == made
    assert reopened.list("key-a") == [made]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", f"{made.id}.json"]  # no temporary file
    assert "key-a" not in (tmp_path / f"{made.id}.json").read_text()  # the key's hash, not the key


def test_a_glossary_is_found_by_id_or_by_name_for_its_pair(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, LIMITS)
    made = store.create(None, "shop", "en", "de", ENTRIES)
    assert store.find(None, made.id, "xx", "yy") == made
    assert store.find(None, "shop", "en", "de") == made
    with pytest.raises(GlossaryNotFound):
        store.find(None, "shop", "de", "en")
    with pytest.raises(GlossaryExists):
        store.create(None, "shop", "en", "de", ENTRIES)
    store.create(None, "shop", "de", "en", [Entry("Warenkorb", "cart")])  # another pair: its own


def test_each_key_sees_only_its_own_glossaries(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, LIMITS)
    mine = store.create("key-a", "shop", "en", "de", ENTRIES)
    assert store.list("key-b") == []
    with pytest.raises(GlossaryNotFound):
        store.get("key-b", mine.id)
    with pytest.raises(GlossaryNotFound):
        store.delete("key-b", mine.id)
    store.create("key-b", "shop", "en", "de", ENTRIES)  # the same name, another key
    store.delete("key-a", mine.id)
    assert store.list("key-a") == []
    assert not (tmp_path / f"{mine.id}.json").exists()
    assert len(GlossaryStore(tmp_path, LIMITS).list("key-b")) == 1


def test_the_count_and_bytes_limits_hold_and_deleting_makes_room(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, GlossaryLimits(100, 50, max_glossaries=2, max_total_bytes=1 << 20))
    first = store.create(None, "a", "en", "de", ENTRIES)
    store.create(None, "b", "en", "de", ENTRIES)
    with pytest.raises(GlossaryFull, match="limit of 2") as e:
        store.create(None, "c", "en", "de", ENTRIES)
    assert e.value.limit == 2
    store.delete(None, first.id)
    store.create(None, "c", "en", "de", ENTRIES)
    small = GlossaryStore(tmp_path / "small", GlossaryLimits(100, 50, 10, max_total_bytes=500))
    small.create(None, "a", "en", "de", ENTRIES)
    with pytest.raises(GlossaryFull, match="500 bytes"):
        small.create(None, "b", "en", "de", ENTRIES)


def test_bad_entries_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, GlossaryLimits(1, 5, 10, 1 << 20))
    with pytest.raises(GlossaryProblem, match="more than the 1"):
        store.create(None, "a", "en", "de", ENTRIES)
    with pytest.raises(GlossaryProblem, match="longer than 5"):
        store.create(None, "a", "en", "de", [Entry("shopping cart", "x")])
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_concurrent_creations_lose_nothing_and_never_pass_the_limit(tmp_path: Path) -> None:
    limit = 40
    store = GlossaryStore(tmp_path, GlossaryLimits(100, 50, max_glossaries=limit, max_total_bytes=1 << 20))
    made: list[str] = []
    refused: list[Exception] = []
    start = threading.Barrier(8)

    def create(worker: int) -> None:
        start.wait()
        for n in range(8):
            try:
                made.append(store.create(f"key-{worker % 2}", f"g{worker}-{n}", "en", "de", ENTRIES).id)
            except GlossaryFull as e:
                refused.append(e)

    threads = [threading.Thread(target=create, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(made), len(refused)) == (limit, 64 - limit)
    reopened = GlossaryStore(tmp_path, store.limits)
    assert sorted(g.id for key in ("key-0", "key-1") for g in reopened.list(key)) == sorted(made)
    assert len(list(tmp_path.iterdir())) == limit + 1  # and the lock


def test_concurrent_deletions_and_creations_keep_the_files_and_the_index_equal(tmp_path: Path) -> None:
    store = GlossaryStore(tmp_path, LIMITS)
    old = [store.create(None, f"old{n}", "en", "de", ENTRIES).id for n in range(20)]

    def delete() -> None:
        for glossary_id in old:
            store.delete(None, glossary_id)

    def create() -> None:
        for n in range(20):
            store.create(None, f"new{n}", "en", "de", ENTRIES)

    threads = [threading.Thread(target=delete), threading.Thread(target=create)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(g.name for g in GlossaryStore(tmp_path, LIMITS).list(None))
    assert names == sorted(f"new{n}" for n in range(20))


# --- several processes on one directory -------------------------------------------------------


def _settle(directory: Path) -> None:
    """Dates the directory's last change a minute back, past the window in which a store lists
    a directory again whatever its stamp says."""
    a_minute_ago = time.time_ns() - 60 * 10**9
    os.utime(directory, ns=(a_minute_ago, a_minute_ago))


def test_stores_on_one_directory_see_each_others_creations_and_deletions(tmp_path: Path) -> None:
    one, other = GlossaryStore(tmp_path, LIMITS), GlossaryStore(tmp_path, LIMITS)
    made = one.create("key-a", "shop", "en", "de", ENTRIES)
    assert other.get("key-a", made.id) == made
    assert other.find("key-a", "shop", "en", "de") == made
    with pytest.raises(GlossaryExists):
        other.create("key-a", "shop", "en", "de", ENTRIES)
    other.delete("key-a", made.id)
    assert one.list("key-a") == []
    with pytest.raises(GlossaryNotFound):
        one.get("key-a", made.id)
    one.create("key-a", "shop", "en", "de", ENTRIES)  # the name is free again


def test_a_lookup_with_nothing_changed_lists_and_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, writer = GlossaryStore(tmp_path, LIMITS), GlossaryStore(tmp_path, LIMITS)
    first = writer.create(None, "first", "en", "de", ENTRIES)
    listings: list[Path] = []
    reads: list[str] = []
    listing, read = store_module._listing, store_module._read

    def counted_listing(directory: Path) -> Any:
        listings.append(directory)
        return listing(directory)

    def counted_read(path: Path, glossary_id: str) -> Any:
        reads.append(glossary_id)
        return read(path, glossary_id)

    monkeypatch.setattr(store_module, "_listing", counted_listing)
    monkeypatch.setattr(store_module, "_read", counted_read)
    _settle(tmp_path)
    assert reader.list(None) == [first]
    assert (len(listings), reads) == (1, [first.id])
    listings.clear()
    reads.clear()
    for _ in range(3):
        assert reader.get(None, first.id) == first
        assert reader.find(None, "first", "en", "de") == first
        assert reader.list(None) == [first]
    assert (listings, reads) == ([], [])  # a stat of the directory each time, no more
    second = writer.create(None, "second", "en", "de", ENTRIES)
    _settle(tmp_path)
    listings.clear()
    reads.clear()
    assert reader.list(None) == [first, second]
    assert (len(listings), reads) == (1, [second.id])  # only the new file is read


def test_a_directory_listed_just_after_a_change_is_listed_again(tmp_path: Path) -> None:
    """Timestamps have ticks (a second on some file systems): a change in the same tick as the
    last one leaves the directory's mtime as the reader saw it."""
    reader, writer = GlossaryStore(tmp_path, LIMITS), GlossaryStore(tmp_path, LIMITS)
    writer.create(None, "first", "en", "de", ENTRIES)
    assert len(reader.list(None)) == 1  # listed within the tick, so to speak
    seen = tmp_path.stat().st_mtime_ns
    writer.create(None, "second", "en", "de", ENTRIES)
    os.utime(tmp_path, ns=(seen, seen))  # the same tick
    assert [g.name for g in reader.list(None)] == ["first", "second"]


def test_an_id_the_listing_lacks_is_looked_up_by_its_file(tmp_path: Path) -> None:
    """A directory stamp that has not moved (as an NFS client's cached attributes) hides a new
    file from lists, not from a lookup of its id."""
    reader, writer = GlossaryStore(tmp_path, LIMITS), GlossaryStore(tmp_path, LIMITS)
    writer.create(None, "first", "en", "de", ENTRIES)
    _settle(tmp_path)
    assert len(reader.list(None)) == 1
    seen = tmp_path.stat().st_mtime_ns
    made = writer.create(None, "second", "en", "de", ENTRIES)
    os.utime(tmp_path, ns=(seen, seen))
    assert reader.get(None, made.id) == made


def test_a_file_that_does_not_parse_is_skipped_until_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = GlossaryStore(tmp_path / "elsewhere", LIMITS)
    whole = elsewhere.create(None, "cut", "en", "de", ENTRIES)
    content = (tmp_path / "elsewhere" / f"{whole.id}.json").read_bytes()
    directory = tmp_path / "shared"
    kept = GlossaryStore(directory, LIMITS).create(None, "kept", "en", "de", ENTRIES)
    (directory / f"{whole.id}.json").write_bytes(content[: len(content) // 2])  # cut short
    (directory / f".{whole.id}.json.x.tmp").write_bytes(b"{")  # being written
    _settle(directory)
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        store = GlossaryStore(directory, LIMITS)
        for _ in range(3):
            assert store.list(None) == [kept]
    warned = [r.getMessage().split(" is not")[0] for r in caplog.records]
    assert warned == [str(directory / f"{whole.id}.json")]  # once, not at each lookup
    (directory / f"{whole.id}.json").write_bytes(content)  # finished in place
    assert store.list(None) == [whole, kept]


_RACE_LIMITS = GlossaryLimits(100, 50, max_glossaries=25, max_total_bytes=1 << 20)


def _create_in_another_process(directory: Path, names: list[str], start: Any, results: Any) -> None:
    write = store_module._write_atomically

    def slow_write(*args: Any) -> Path:
        time.sleep(0.005)  # as on a network volume: the check and the write far apart
        return write(*args)

    store_module._write_atomically = slow_write  # this process's own module
    store = GlossaryStore(directory, _RACE_LIMITS)
    made, refused = [], []
    start.wait()
    for name in names:
        try:
            made.append(store.create(None, name, "en", "de", ENTRIES).id)
        except (GlossaryFull, GlossaryExists) as e:
            refused.append(type(e).__name__)
    results.put((made, refused))


def _race(directory: Path, names: list[list[str]]) -> tuple[list[str], list[str]]:
    """Each list of names created by a process of its own, all starting together: the ids made
    and the refusals' kinds."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(len(names)), context.Queue()
    processes = [
        context.Process(target=_create_in_another_process, args=(directory, mine, start, results))
        for mine in names
    ]
    for p in processes:
        p.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [i for made, _ in outcomes for i in made], [k for _, refused in outcomes for k in refused]


def test_creations_racing_in_two_processes_never_pass_the_limit_and_lose_nothing(tmp_path: Path) -> None:
    made, refused = _race(tmp_path, [[f"p{p}-{n}" for n in range(20)] for p in range(2)])
    assert (len(made), refused) == (25, ["GlossaryFull"] * 15)
    kept = GlossaryStore(tmp_path, _RACE_LIMITS).list(None)
    assert sorted(g.id for g in kept) == sorted(made)


def test_a_name_is_taken_once_by_processes_racing_for_it(tmp_path: Path) -> None:
    names = [f"shared-{n}" for n in range(12)]
    made, refused = _race(tmp_path, [names, names])
    assert (len(made), refused) == (12, ["GlossaryExists"] * 12)
    kept = GlossaryStore(tmp_path, _RACE_LIMITS).list(None)
    assert sorted(g.name for g in kept) == sorted(names)


def test_only_an_id_names_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    outside = GlossaryStore(tmp_path / "outside", LIMITS).create(None, "shop", "en", "de", ENTRIES)
    store = GlossaryStore(tmp_path / "glossaries", LIMITS)
    store.create(None, "shop", "en", "de", ENTRIES)
    with caplog.at_level(logging.WARNING, logger=store_module.__name__), pytest.raises(GlossaryNotFound):
        store.get(None, f"../outside/{outside.id}")
    assert caplog.records == []  # not even opened
