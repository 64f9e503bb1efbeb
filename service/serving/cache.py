"""Sentence translations kept for when the same sentence comes again: a byte-bounded LRU.

Exact, not approximate: a sentence's translation depends only on the model's artefact, the
engine's shortlist setting, the sentence and its decoding options (the engine guarantees it does
not depend on the batch it ran in, nor on anything else running), and all of them are its key.
The artefact is named by its manifest's sha256, which lists every file's sha256 with the model's
name, variant and decoding defaults; the options are the whole ``TranslateOptions`` (beam size,
n-best, max length, length penalty, alignments), so an option added there is in the key at once.

The serving layer looks sentences up before submitting them (``service/serving/translation.py``):
found ones never reach the queue. Only an engine's whole, successful answer is kept: never an
exception, never a result with fewer hypotheses than its n-best asked for.

Used from the event loop only (lookups and stores run between two awaits of a request), so it
takes no lock. Written on ``OrderedDict`` (O(1) ``move_to_end`` and ``popitem(last=False)``)
rather than cachetools' ``LRUCache(getsizeof=...)``, which would fit but ships no type
information (mypy would see its cache as ``Any`` without typeshed's stubs, another package) and
would still need a subclass to count evictions, for what is a few lines here.
"""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict
from collections.abc import Sequence

from service.artefacts import Manifest
from service.engine.base import TranslateItem, TranslateOptions, Translation, TranslationHypothesis
from service.metrics import CACHE_BYTES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES, labelled

# (artefact's identity, shortlist decoding, the sentence, its decoding options)
CacheKey = tuple[str, bool, str, TranslateOptions]

# What every entry holds besides its sentence and translation: its key tuple, the OrderedDict's
# link and slot, the (translation, size) pair, the dataclass instances and their __dict__s.
_ENTRY_OVERHEAD = 400
_OBJECT = 120  # one dataclass instance with its __dict__
_FLOAT = sys.getsizeof(0.0)


def artefact_identity(manifest: Manifest) -> str:
    """The sha256 of the manifest as served: it changes whenever any file, the name, the variant
    or the decoding defaults change."""
    return hashlib.sha256(manifest.model_dump_json().encode()).hexdigest()


class TranslationCache:
    """Sentence → its ``Translation``, least recently used first out once over ``max_bytes``
    (0: nothing is kept). Sizes are the entries' Python objects, estimated once when stored."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[CacheKey, tuple[Translation, int]] = OrderedDict()
        self._identities: dict[str, tuple[Manifest, str]] = {}  # by model name: computed once

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self, manifest: Manifest, shortlist: bool, items: Sequence[TranslateItem]) -> list[CacheKey]:
        """Each item's key, for the model whose manifest is ``manifest``."""
        known = self._identities.get(manifest.name)
        if known is None or known[0] is not manifest:
            known = self._identities[manifest.name] = (manifest, artefact_identity(manifest))
        identity = known[1]
        return [(identity, shortlist, item.text, item.options) for item in items]

    def lookup(self, model: str, keys: Sequence[CacheKey]) -> list[Translation | None]:
        """Each key's translation, None where there is none (each found one becomes the most
        recently used); counted as hits and misses of ``model``."""
        if not self.max_bytes:
            return [None] * len(keys)
        found: list[Translation | None] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            found.append(entry[0] if entry is not None else None)
        hits = sum(f is not None for f in found)
        labelled(CACHE_HITS, model).inc(hits)
        labelled(CACHE_MISSES, model).inc(len(keys) - hits)
        return found

    def store(self, key: CacheKey, result: Translation | Exception) -> None:
        """Keep ``result`` under ``key`` if it is a whole translation and fits at all, dropping
        the least recently used entries until the cache is within its bound again."""
        if not isinstance(result, Translation) or len(result.hypotheses) != key[3].n_best:
            return
        size = _ENTRY_OVERHEAD + sys.getsizeof(key[2]) + translation_bytes(result)
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (result, size)
        self.bytes += size
        evicted = 0
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            evicted += 1
        if evicted:
            CACHE_EVICTIONS.inc(evicted)
        CACHE_BYTES.set(self.bytes)


def translation_bytes(translation: Translation) -> int:
    """The bytes of a translation's objects: its strings, lists and floats (an alignment is a
    list of lists of Python floats, the largest part when asked for)."""
    return (
        _OBJECT
        + _list_bytes(translation.source_tokens)
        + sys.getsizeof(translation.hypotheses)
        + sum(_hypothesis_bytes(h) for h in translation.hypotheses)
    )


def _hypothesis_bytes(hypothesis: TranslationHypothesis) -> int:
    size = _OBJECT + sys.getsizeof(hypothesis.text) + _FLOAT + _list_bytes(hypothesis.tokens)
    if hypothesis.alignment is not None:
        rows = hypothesis.alignment
        size += sys.getsizeof(rows) + sum(sys.getsizeof(row) + _FLOAT * len(row) for row in rows)
    return size


def _list_bytes(strings: Sequence[str]) -> int:
    return sys.getsizeof(strings) + sum(sys.getsizeof(s) for s in strings)
