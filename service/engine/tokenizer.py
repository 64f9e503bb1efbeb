"""A thin wrapper over ``tokenizers.Tokenizer`` with the service's length policy.

The artefact's ``tokenizer.json`` may carry its own truncation and padding settings (the
MiniLM one pads every text to 128); both are switched off here: the engine pads a batch to
its longest member only, and decides per item what an over-long text means — truncated
(keeping the end-of-sequence special tokens the post-processor adds) or ``TextTooLong``.
``padded_partition`` says where to cut a length-sorted batch so its padding costs least;
``SubBatches`` applies it for the encoder-only engines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.artefacts import ArtefactError
from service.cuda import CUDA
from service.engine.base import Encoded, TextTooLong
from service.engine.ids_tokenizer import IdsTokenizer

__all__ = ["Encoded", "EncodingCache", "SubBatches", "TextTokenizer", "padded_partition", "right_padded"]

RUN_COST_TOKENS = 8
"""What one more encoder run costs on the CPU, in padded tokens: a run's fixed overhead against
its per-token cost, which decides where a batch is cut (docs/decisions.md, "Batches are cut where
their padding costs least")."""
DEVICE_RUN_COST_TOKENS = 1 << 20
"""The same on CUDA: there a run costs its kernel launches (on the H100, a decoder step of our
3-layer model took about 3 ms whatever its batch), and the padding a batch within its limits
holds is computed in parallel at almost no cost, so a batch is cut only where its limits force."""
DEVICE_SHAPE_STEPS = (8, 16)
"""On CUDA a run is padded to rows a multiple of 8 and a length a multiple of 16: the device pays a
one-time setup for every new input shape (5 ms on an H200, 43-74 ms with cuDNN's flash attention
on), and unpadded batches bring new shapes for as long as the engine serves (up to rows × lengths
of them); padded, a model of 128 tokens and runs of 128 rows has 128 (docs/decisions.md)."""


def padded_partition(
    lengths: Sequence[int], max_rows: int, max_tokens: int, run_cost: int = RUN_COST_TOKENS
) -> list[tuple[int, int]]:
    """Cut ascending ``lengths`` into runs [start, end) of at most ``max_rows`` rows and
    ``max_tokens`` padded tokens (rows × longest; a single row may exceed it) that minimise
    Σ (run_cost + rows × longest): a batch of sentences of 5 to 50 tokens is mostly padding
    when run as one, and one run per sentence pays the run cost each time.

    Dynamic programming over the cut points: ``best[j]`` is the least cost of the first j.
    """
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    start_of = [0] * (n + 1)
    for end in range(1, n + 1):
        longest = lengths[end - 1]
        for start in range(end - 1, max(0, end - max_rows) - 1, -1):
            rows = end - start
            if rows > 1 and rows * longest > max_tokens:
                break  # more rows only pad more
            cost = best[start] + run_cost + rows * longest
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    cuts: list[tuple[int, int]] = []
    end = n
    while end > 0:
        cuts.append((start_of[end], end))
        end = start_of[end]
    return cuts[::-1]


def right_padded(
    seqs: Sequence[Sequence[int]], pad_id: int, rows: int = 0, width: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad to the longest sequence, or to ``width`` if longer: ids (B, T) int64 and mask
    (B, T) int64, 1 = real; B is ``rows`` where that is more than the sequences, the rows beyond
    them one pad token each (``SubBatches.run_shape``; their outputs are dropped). The ids are
    read in one pass and put in place by the mask (row-major, as they come), not row by row."""
    lengths = np.fromiter(map(len, seqs), dtype=np.intp, count=len(seqs))
    width = max(int(lengths.max(initial=0)), width)
    real = np.arange(width) < lengths[:, None]
    ids = np.full((max(len(seqs), rows), width), pad_id, dtype=np.int64)
    ids[: len(seqs)][real] = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    mask = np.zeros(ids.shape, dtype=np.int64)
    mask[: len(seqs)] = real
    mask[len(seqs) :, :1] = 1
    return ids, mask


@dataclass(frozen=True)
class SubBatches:
    """How an encoder-only engine (embeddings, rerank) cuts a batch: runs of at most ``max_rows``
    items and ``max_tokens`` padded tokens, where the padding costs least (``padded_partition``)."""

    max_rows: int = 64
    max_tokens: int = 16384
    run_cost_tokens: int = RUN_COST_TOKENS
    shape_steps: tuple[int, int] = (1, 1)  # a run's rows and length, padded up to multiples of these

    def on_device(self) -> SubBatches:
        """These limits for an engine on CUDA: a run costs its launches (``DEVICE_RUN_COST_TOKENS``),
        only the token budget bounds its rows (a GPU computes many short rows as fast as a few),
        and its shape is padded to a few (``DEVICE_SHAPE_STEPS``)."""
        return replace(
            self,
            max_rows=max(self.max_rows, self.max_tokens),
            run_cost_tokens=DEVICE_RUN_COST_TOKENS,
            shape_steps=DEVICE_SHAPE_STEPS,
        )

    def run_shape(self, rows: int, length: int, max_length: int) -> tuple[int, int]:
        """The (rows, length) a run of ``rows`` items, the longest ``length`` tokens, is padded to:
        up to ``shape_steps``, the length never past the model's ``max_length`` on that account."""
        step_rows, step_length = self.shape_steps
        padded_length = max(length, min(-(-length // step_length) * step_length, max_length))
        return -(-rows // step_rows) * step_rows, padded_length

    def for_provider(self, provider: str) -> SubBatches:
        """These limits for an engine whose session runs on ``provider``: a run on CUDA costs
        its launches, not its padding."""
        return self.on_device() if provider == CUDA else self

    def cut(self, lengths: Mapping[int, int]) -> list[list[int]]:
        """Item → token count in; the items, shortest first, in their runs out."""
        order = sorted(lengths, key=lengths.__getitem__)
        if not order:
            return []
        padded = len(order) * lengths[order[-1]]
        if len(order) <= self.max_rows and padded <= min(self.max_tokens, self.run_cost_tokens):
            # one run: it fits, and no cut could save more padding than a second run costs
            return [order]
        lengths_in_order = [lengths[i] for i in order]
        runs = padded_partition(lengths_in_order, self.max_rows, self.max_tokens, self.run_cost_tokens)
        return [order[start:end] for start, end in runs]


DEFAULT_SUB_BATCHES = SubBatches()


class EncodingCache:
    """Each text encoded once by ``encode`` (an engine's): segmentation measures its units with
    ``count``, and the queue's cost and the engine reuse the same encodings. One request's: never
    shared between threads."""

    def __init__(self, encode: Callable[[list[str]], list[Encoded]]) -> None:
        self._encode = encode
        self._done: dict[str, Encoded] = {}

    def __call__(self, text: str) -> Encoded:
        encoded = self._done.get(text)
        if encoded is None:
            encoded = self._done[text] = self._encode([text])[0]
        return encoded

    def count(self, text: str) -> int:
        return self(text).n_tokens


class TextTokenizer:
    """Encode/decode with a fixed maximum length; safe to share between threads (never mutated but
    for its list of pieces, made alike by whichever thread needs it first)."""

    def __init__(self, tokenizer: Tokenizer, max_len: int, pad_id: int) -> None:
        self.max_len = max_len
        self.pad_id = pad_id
        self._full = Tokenizer.from_str(tokenizer.to_str())
        self._full.no_truncation()
        self._full.no_padding()
        # A second instance so that truncating never flips settings on a shared object.
        self._truncating = Tokenizer.from_str(self._full.to_str())
        self._truncating.enable_truncation(max_len)
        self._ids = IdsTokenizer(self._full, self._truncating, max_len)

    @classmethod
    def from_file(cls, path: Path, max_len: int, pad_id: int) -> TextTokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception on a bad file
            raise ArtefactError(f"{path}: cannot load the tokenizer: {e}") from e
        return cls(tokenizer, max_len, pad_id)

    def count(self, text: str) -> int:
        """Tokens of ``text`` before any truncation, special tokens included."""
        return len(self._full.encode(text).ids)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Every token of each text, special tokens included, before any truncation."""
        return [
            Encoded(enc.ids, enc.tokens, truncated=False, offsets=enc.offsets)
            for enc in _encode_all(self._full, texts)
        ]

    def encode_batch(
        self,
        texts: Sequence[str],
        truncate: Sequence[bool],
        given: Sequence[Encoded | None] | None = None,
    ) -> list[Encoded | TextTooLong]:
        """One entry per text: its encoding, or ``TextTooLong`` where it is over and may not be cut.

        ``given``: whole encodings already made by ``encode`` (None where not): only the others
        are tokenized here.
        """
        full: list[Encoded | None] = list(given) if given is not None else [None] * len(texts)
        missing = [i for i, enc in enumerate(full) if enc is None]
        made = iter(self.encode([texts[i] for i in missing]))
        whole = [enc if enc is not None else next(made) for enc in full]
        out: list[Encoded | TextTooLong] = []
        for text, enc, may_cut in zip(texts, whole, truncate, strict=True):
            n = enc.n_tokens
            if n <= self.max_len:
                out.append(enc)
            elif may_cut:
                # Re-encoded with truncation so the post-processor's specials survive the cut.
                cut = self._truncating.encode(text)
                out.append(Encoded(cut.ids, cut.tokens, truncated=True, offsets=cut.offsets))
            else:
                out.append(self._too_long(n))
        return out

    def encode_ids(
        self, texts: Sequence[str], truncate: Sequence[bool], given: Sequence[Encoded | None]
    ) -> list[Encoded | TextTooLong]:
        """``encode_batch`` for an engine that reads only the ids (embeddings): the texts that may
        be cut tokenized in one call that cuts them, the others in one call whole, by
        ``IdsTokenizer`` (the library's ids, without its alignments on ASCII text under BERT's
        tokenizer), no token strings kept; ``given`` encodings (None where not) go through
        ``encode_batch``."""
        out: list[Encoded | TextTooLong | None] = [None] * len(texts)
        known = [i for i, enc in enumerate(given) if enc is not None]
        if known:
            made = self.encode_batch(
                [texts[i] for i in known], [truncate[i] for i in known], [given[i] for i in known]
            )
            for i, result in zip(known, made, strict=True):
                out[i] = result
        for may_cut in (True, False):
            todo = [i for i, enc in enumerate(given) if enc is None and truncate[i] == may_cut]
            ids_of = self._ids.encode([texts[i] for i in todo], may_cut)
            for i, (ids, was_cut) in zip(todo, ids_of, strict=True):
                n = len(ids)
                out[i] = Encoded(ids, [], was_cut) if n <= self.max_len else self._too_long(n)
        return [r for r in out if r is not None]

    def _too_long(self, n: int) -> TextTooLong:
        return TextTooLong(f"text has {n} tokens; the model takes at most {self.max_len}", self.max_len)

    def pad(
        self, seqs: Sequence[Sequence[int]], rows: int = 0, width: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``right_padded`` with this tokenizer's pad id."""
        return right_padded(seqs, self.pad_id, rows, width)

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Each sequence's text, one after the other: the library's batch call hands the few a
        sentence has to its thread pool, for more CPU than it saves."""
        return [self._full.decode(list(x), skip_special_tokens=True) for x in ids]

    def id_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Each id's piece ("" for an id the vocabulary lacks)."""
        pieces = self._pieces
        if max(ids, default=0) < len(pieces):  # token ids are never negative
            return list(map(pieces.__getitem__, ids))
        return [pieces[i] if i < len(pieces) else "" for i in ids]

    @cached_property
    def _pieces(self) -> list[str]:
        """Each id's piece, looked up in Python (the library's id_to_token is a call per token);
        made on first use: an embedder never names pieces."""
        vocabulary = self._full.get_vocab(with_added_tokens=True)
        pieces = [""] * (max(vocabulary.values(), default=-1) + 1)
        for piece, i in vocabulary.items():
            pieces[i] = piece
        return pieces

    def token_to_id(self, token: str) -> int | None:
        return self._full.token_to_id(token)


def _encode_all(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Encoding]:
    """Each text's encoding, in one call; one text without the hand-off to the library's thread pool."""
    if len(texts) == 1:
        return [tokenizer.encode(texts[0])]
    return tokenizer.encode_batch(list(texts)) if texts else []
