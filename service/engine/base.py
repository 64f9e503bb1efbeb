"""What the queue and the API see of an engine: items in, per-item results out.

An engine runs one batch at a time in a worker thread. It returns one result per item, in
order; an item that fails yields its exception in its slot, so one bad item never fails the
others (the queue turns it into that request's error).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from service.artefacts import Manifest


# Encoded, EmbedItem and Embedding: read-only by convention, not frozen: a frozen dataclass's
# __init__ sets each field through object.__setattr__ (2 µs an item here, one item per text on
# the event loop and one result on the worker), a plain one with slots in a quarter of that.
@dataclass(slots=True)
class Encoded:
    ids: list[int]  # with the special tokens the post-processor adds (BERT: [CLS] … [SEP]; ours: … </s>)
    tokens: list[str]  # the same pieces as strings (for alignments)
    truncated: bool
    # Each token's [start, end) in the text (special tokens: empty), where the caller needs to
    # find a part of the text among the tokens (a glossary term's); None: not kept.
    offsets: list[tuple[int, int]] | None = field(default=None, compare=False, repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class EmbedItem:
    text: str
    truncate: bool = True  # False: a text over the model's max length is an error
    # The text's whole encoding (``Engine.encode``) when the caller has it, so that a text is
    # tokenized once, for the queue's cost and the engine alike; None: the engine tokenizes.
    encoded: Encoded | None = field(default=None, compare=False, repr=False)
    normalize: bool = False  # True: the vector comes back L2-normalised (on the engine's worker)
    dimensions: int | None = None  # its first N dimensions only (Matryoshka), normalised after the cut


@dataclass(slots=True)
class Embedding:
    vector: np.ndarray  # (dim,) float32; pooled, L2-normalised when its item asked
    n_tokens: int


@dataclass(frozen=True)
class TranslateOptions:
    beam_size: int = 4
    n_best: int = 1
    max_length: int = 256  # output tokens
    length_penalty: float = 1.0
    alignments: bool = False
    # The first output token, forced (a multilingual model's target-language token); None: the
    # artefact's default (its one target language's token, or nothing forced). In the options so
    # that it travels with them to the running decode and into the cache keys.
    forced_first_token: int | None = None
    # A multilingual model's source-language token, in place of the one its tokenizer puts on
    # the input (the artefact's default source language's); None: the input as tokenized.
    source_token: int | None = None
    # Target-language phrases that must each appear in every hypothesis (glossary terms and
    # do-not-translate placeholders the serving layer chose for this sentence), spelled as inside
    # a sentence; the search enforces them (service/engine/translation/constraints.py). Empty: a free search.
    required: tuple[str, ...] = ()
    # Where each required phrase comes from in the text, [start, end) in characters (a glossary
    # match's source term, a kept span's placeholder), so the search puts it where the model's
    # alignment of a free translation says (service/engine/translation/placement.py); None for
    # a phrase of no source span. Empty: none has one.
    required_sources: tuple[tuple[int, int] | None, ...] = ()


@dataclass(frozen=True)
class TranslateItem:
    text: str
    options: TranslateOptions = field(default_factory=TranslateOptions)
    encoded: Encoded | None = field(default=None, compare=False, repr=False)  # as ``EmbedItem``'s
    # Set when nobody waits for the result any more (client gone, deadline passed): the search
    # drops the sentence at its next decoder step.
    abandoned: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


@dataclass(frozen=True)
class TranslationHypothesis:
    text: str
    score: float
    tokens: list[str]  # target subword pieces
    alignment: list[list[float]] | None  # (target tokens, source tokens)


@dataclass(frozen=True)
class Translation:
    hypotheses: list[TranslationHypothesis]  # best first, n_best of them
    source_tokens: list[str]
    n_input_tokens: int
    n_output_tokens: int  # of the best hypothesis


class Abandoned(RuntimeError):
    """The item's request was gone before it was computed (its result goes to nobody)."""


class TextTooLong(ValueError):
    """A text longer than the model's max length while truncation is off (→ 422 for that item)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit  # the model's max length, in tokens


class Engine(Protocol):
    manifest: Manifest
    provider: str  # "CUDAExecutionProvider" / "CPUExecutionProvider"

    def count_tokens(self, text: str) -> int: ...

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Each text's every token, special tokens included, not truncated (the engine applies
        its length policy to these when they come back with the items)."""
        ...

    def warmup(self) -> None: ...


class EmbedEngine(Engine, Protocol):
    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]: ...


class TranslateEngine(Engine, Protocol):
    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]: ...


@runtime_checkable
class KeepsSpareMemory(Protocol):
    """An engine that keeps memory from one call for the next (a decode's cache buffers)."""

    def release_spare_memory(self) -> int:
        """Let it go; → the bytes it held."""
        ...
