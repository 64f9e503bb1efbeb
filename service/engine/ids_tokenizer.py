"""Token ids of texts, the same as the library's tokenizer makes, for callers that read ids only
(the embedder): without offsets or token strings, and on ASCII text under BERT's normaliser
without the library's normaliser and post-processor either.

The tokenizers library's ``BertNormalizer`` (BERT, MiniLM, BGE, E5, …) tracks each character's
alignment through every change it makes, and its post-processor rebuilds every field of an
encoding to add two special tokens: together more than half of a short sentence's tokenization
(the host stage, benchmarks/host/embedding.py). On ASCII text most of the normaliser's steps do
nothing (CJK spacing, accent stripping); what is left is its clean-up (control characters
dropped, ``\\t \\n \\r`` made spaces) and lowercasing, which ``str.translate`` and ``str.lower``
do without alignments (``AsciiNormalizer``); the special tokens a single text gets around it
(``[CLS] … [SEP]``) are put on its ids here, and a text to cut is cut to the room they leave, as
the library cuts it. Token ids are the same (tests/service/engine/test_ids_tokenizer.py holds
every ASCII character and the cut to the library's own). Any other normaliser or post-processor,
or a text with a non-ASCII character, goes through the library's tokenizer as it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Encoding, Tokenizer

# BertNormalizer's clean-up on ASCII: NUL and the other control characters (Unicode Cc) dropped,
# except tab, newline and carriage return, which are whitespace and become spaces
_CLEAN = {c: None for c in [*range(0x20), 0x7F]} | {ord(c): " " for c in "\t\n\r"}
_PROBES = ("a", "hello world, again")  # texts whose special tokens tell where a text goes


@dataclass(frozen=True)
class AsciiNormalizer:
    """``BertNormalizer`` with these settings, on ASCII text."""

    clean_text: bool
    lowercase: bool

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> AsciiNormalizer | None:
        """The tokenizer's normaliser done in ``str`` methods, or None where it is not BERT's."""
        config = json.loads(tokenizer.to_str()).get("normalizer") or {}
        if config.get("type") != "BertNormalizer":
            return None
        return cls(bool(config.get("clean_text", True)), bool(config.get("lowercase", True)))

    def __call__(self, text: str) -> str:
        """``text`` (ASCII) as the normaliser leaves it."""
        if self.clean_text and not text.isprintable():  # on ASCII: it holds a control character
            text = text.translate(_CLEAN)
        return text.lower() if self.lowercase else text


def single_specials(tokenizer: Tokenizer) -> tuple[list[int], list[int]] | None:
    """The special token ids the post-processor puts before and after a single text, or None
    where they are not the same around every text."""
    found = set()
    for probe in _PROBES:
        whole = tokenizer.encode(probe).ids
        bare = tokenizer.encode(probe, add_special_tokens=False).ids
        starts = [k for k in range(len(whole) - len(bare) + 1) if whole[k : k + len(bare)] == bare]
        if not bare or not starts:
            return None
        k = starts[0]
        found.add((tuple(whole[:k]), tuple(whole[k + len(bare) :])))
    if len(found) != 1:
        return None
    prefix, suffix = found.pop()
    return list(prefix), list(suffix)


@dataclass(frozen=True)
class _AsciiPath:
    """What tokenizes ASCII text without the library's normaliser and post-processor."""

    normalize: AsciiNormalizer
    prefix: list[int]
    suffix: list[int]
    room: int  # tokens of the text itself a cut leaves
    bare: dict[bool, Tokenizer]  # cut → the library's tokenizer without either


class IdsTokenizer:
    """The ids of texts, whole or cut at ``max_len`` (special tokens kept, as ``whole`` and ``cut``
    make them: the library's tokenizer without and with truncation at ``max_len``), and whether
    each was cut."""

    def __init__(self, whole: Tokenizer, cut: Tokenizer, max_len: int) -> None:
        self._library = {False: whole, True: cut}
        self._max_len = max_len
        self._ascii = _ascii_path(whole, max_len)

    def encode(self, texts: Sequence[str], cut: bool) -> list[tuple[list[int], bool]]:
        """Each text's ids and whether it was cut (``cut`` False: never), in the texts' order."""
        fast = self._ascii
        if fast is None:
            return self._by_library(texts, cut)
        ascii_texts = [i for i, text in enumerate(texts) if text.isascii()]
        made = _encode_all(fast.bare[cut], [fast.normalize(texts[i]) for i in ascii_texts])
        prefix, suffix, room = fast.prefix, fast.suffix, fast.room
        done = [(prefix + e.ids + suffix, cut and len(e.ids) == room and bool(e.overflowing)) for e in made]
        if len(ascii_texts) == len(texts):
            return done
        others = [i for i, text in enumerate(texts) if not text.isascii()]
        placed = dict(zip(ascii_texts, done, strict=True))
        placed |= dict(zip(others, self._by_library([texts[i] for i in others], cut), strict=True))
        return [placed[i] for i in range(len(texts))]

    def _by_library(self, texts: Sequence[str], cut: bool) -> list[tuple[list[int], bool]]:
        made = _encode_all(self._library[cut], texts)
        return [(e.ids, cut and len(e.ids) == self._max_len and bool(e.overflowing)) for e in made]


def _ascii_path(whole: Tokenizer, max_len: int) -> _AsciiPath | None:
    normalize = AsciiNormalizer.of(whole)
    specials = single_specials(whole)
    if normalize is None or specials is None:
        return None
    prefix, suffix = specials
    room = max_len - len(prefix) - len(suffix)
    bare: dict[bool, Tokenizer] = {}
    for may_cut in (False, True):
        bare[may_cut] = Tokenizer.from_str(whole.to_str())
        bare[may_cut].normalizer = None
        bare[may_cut].post_processor = None
        if may_cut:
            bare[may_cut].enable_truncation(room)
    return _AsciiPath(normalize, prefix, suffix, room, bare)


def _encode_all(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Encoding]:
    """Each text's encoding in one call, without offsets (the library's fast batch call)."""
    if len(texts) == 1:
        return [tokenizer.encode(texts[0])]
    return tokenizer.encode_batch_fast(list(texts)) if texts else []
