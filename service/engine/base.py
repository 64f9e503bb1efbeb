"""What the batcher and the API see of an engine: items in, per-item results out.

An engine runs one batch at a time in a worker thread. It returns one result per item, in
order; an item that fails yields its exception in its slot, so one bad item never fails the
others (the batcher turns it into that request's error).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.artefacts import Manifest


@dataclass(frozen=True)
class EmbedItem:
    text: str
    truncate: bool = True  # False: a text over the model's max length is an error


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # (dim,) float32; pooled, not normalised
    n_tokens: int


@dataclass(frozen=True)
class TranslateOptions:
    beam_size: int = 4
    n_best: int = 1
    max_length: int = 256  # output tokens
    length_penalty: float = 1.0
    alignments: bool = False


@dataclass(frozen=True)
class TranslateItem:
    text: str
    options: TranslateOptions = field(default_factory=TranslateOptions)
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

    def warmup(self) -> None: ...


class EmbedEngine(Engine, Protocol):
    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]: ...


class TranslateEngine(Engine, Protocol):
    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]: ...
