"""What a sentence keeps of its free search for the search it starts again with its phrases placed.

A sentence with required phrases searches free first (running.py); when its result misses one,
it searches again with the phrases placed (placement.py), forced through its free translation's
tokens up to the first of them. Run as a new sentence, that search would run the encoder on its
source again and the decoder over those free tokens again. So while a free search that may
start again runs, ``Restarts`` keeps
* its encoder output (on the host: the slot layout's), which the new search starts on;
* with a decoder that ``resumes``, the cache of the row each of its kept finished hypotheses
  ended on (``Decoder.park``): the new search then starts after the free tokens before its first
  phrase, on those columns, with their log-probs and attention as the free search had them.
Either way the new search's rows are the same as if it had run them: the same model on the same
tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from service.engine.translation.decoding import Decoder
from service.engine.translation.sentence_search import SentenceSearch, TokenHypothesis

Memory = tuple[np.ndarray, np.ndarray]  # K, V (n_layers, heads, source tokens, d_head)


class Restarts:
    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self._memories: dict[SentenceSearch, Memory] = {}  # free searches', then their new ones'
        self._watched: set[SentenceSearch] = set()  # free searches whose rows' ends are parked
        # per free search: its kept finished hypotheses' rows' cache, by the hypothesis' id
        self._ended: dict[SentenceSearch, dict[int, tuple[TokenHypothesis, np.ndarray]]] = {}
        self._parked: dict[SentenceSearch, np.ndarray] = {}  # new searches' caches to start on

    @property
    def watched(self) -> set[SentenceSearch]:
        """The free searches whose rows' ends are parked: each step reads their ``ended_on``."""
        return self._watched

    @property
    def watching(self) -> bool:
        """Whether a free search's rows are to be parked as they end (``park_ended``)."""
        return bool(self._watched) and self.decoder.resumes

    def keep(self, sentences: Sequence[tuple[int, SentenceSearch, int]], memory: tuple[Any, Any]) -> None:
        """The encoder output of the ``sentences`` of one run that may start again (their index
        in the run, search, source tokens), when it is on the host."""
        keys, values = memory
        if not isinstance(keys, np.ndarray) or not isinstance(values, np.ndarray):
            return
        for i, search, n in sentences:
            self._memories[search] = keys[:, i, :, :n].copy(), values[:, i, :, :n].copy()
            self._watched.add(search)

    def memory(self, searches: Sequence[SentenceSearch], width: int) -> Memory | None:
        """``searches``' kept encoder outputs as one run's, ``width`` tokens wide (zero past
        each source's end: masked), if each has one (taken)."""
        kept = [m for m in (self._memories.pop(s, None) for s in searches) if m is not None]
        if not kept or len(kept) < len(searches):
            return None
        layers, heads, _, d_head = kept[0][0].shape
        keys = np.zeros((layers, len(kept), heads, width, d_head), dtype=kept[0][0].dtype)
        values = np.zeros_like(keys)
        for i, (k, v) in enumerate(kept):
            keys[:, i, :, : k.shape[2]] = k
            values[:, i, :, : v.shape[2]] = v
        return keys, values

    def park_ended(self, first_rows: dict[SentenceSearch, int]) -> None:
        """After a step, before the decoder's reorder: park the cache of the rows the step's
        finished hypotheses of watched searches ended on (``first_rows``: each search's first
        row in the step), and let go of those no longer kept."""
        for search in self._watched:
            first = first_rows.get(search)
            if first is None or not search.ended_on:
                continue
            ended = self._ended.setdefault(search, {})
            kept = {id(h) for h in search.finished}
            for h, row in search.ended_on:
                if id(h) in kept:  # <s> and all its tokens but the last
                    columns = len(h.tokens) + (search.forced_first is not None)
                    ended[id(h)] = (h, self.decoder.park(first + row, columns))
            for gone in set(ended) - kept:
                del ended[gone]

    def hand_over(
        self, free: SentenceSearch, again: SentenceSearch, best: TokenHypothesis | None, free_tokens: int
    ) -> None:
        """``again`` replaces the finished ``free``: it gets ``free``'s encoder output, and when
        it is forced through ``free_tokens`` of ``best`` first (a placed search) and ``best``'s
        row was parked, it starts after them (``SentenceSearch.resume``) on that row's cache."""
        memory = self._memories.pop(free, None)
        ended = self._ended.pop(free, {}).get(id(best))
        self._watched.discard(free)
        if memory is not None:
            self._memories[again] = memory
        if ended is None or best is None or again.prefix is None or not free_tokens:
            return
        if best.token_log_probs is None or best.alignment is None:
            return
        forced = [] if again.forced_first is None else [again.forced_first]
        tokens = [*forced, *again.prefix.tokens[:free_tokens]]
        log_probs = np.concatenate([np.zeros(len(forced)), best.token_log_probs[:free_tokens]])
        alignment = best.alignment[:free_tokens]
        if forced:  # the forced first token's attention is never kept in a result
            alignment = np.concatenate([np.zeros((1, alignment.shape[1])), alignment])
        again.resume(tokens, log_probs, alignment)
        self._parked[again] = ended[1][:, :, : len(tokens)]

    def start(self, search: SentenceSearch, row: int) -> None:
        """``search``'s first row, just admitted at ``row``, on its parked cache if it has one."""
        if (cache := self._parked.pop(search, None)) is not None:
            self.decoder.resume(row, cache)

    def forget(self, search: SentenceSearch) -> None:
        """A search done or cancelled: nothing of it is kept."""
        self._memories.pop(search, None)
        self._watched.discard(search)
        self._ended.pop(search, None)
        self._parked.pop(search, None)
