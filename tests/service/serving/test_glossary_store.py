"""Glossaries on disk: kept across a restart, written atomically, bounded, per API key."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

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
    assert list(tmp_path.iterdir()) == [tmp_path / f"{made.id}.json"]  # no temporary file left
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
    assert len(list(tmp_path.iterdir())) == limit


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
