"""Token ids of texts, the same as the library's tokenizer makes, for callers that read ids only
(the embedder): without offsets or token strings, and on ASCII text under BERT's tokenizer
without the library's normaliser, pre-tokenizer and post-processor either.

The tokenizers library's ``BertNormalizer`` (BERT, MiniLM, BGE, E5, …) tracks each character's
alignment through every change it makes, its pre-tokenizer each piece's offsets, and its
post-processor rebuilds every field of an encoding to add two special tokens: most of a short
sentence's tokenization (the host stage, benchmarks/host/embedding.py, 59 → 15 µs a sentence in
process). On ASCII text most of the normaliser's steps do nothing (CJK spacing, accent
stripping); what is left is its clean-up (control characters dropped, ``\t \n \r`` made spaces)
and lowercasing, which ``str.translate`` and ``str.lower`` do (``AsciiNormalizer``); the words
the pre-tokenizer would make are a regular expression's; the model reads each word alone, so a
word's ids are kept in a bounded cache and only new words go to the library (in one call); the
special tokens a single text gets (``[CLS] … [SEP]``) are put around, and a text to cut is cut
to the room they leave, as the library cuts it. Token ids are the same
(tests/service/engine/test_ids_tokenizer.py holds every ASCII character, random ASCII and the
cut to the library's own). Any other tokenizer, or a text with a non-ASCII character, goes
through the library as it is.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from tokenizers import Encoding, Tokenizer

# BertNormalizer's clean-up on ASCII: NUL and the other control characters (Unicode Cc) dropped,
# except tab, newline and carriage return, which are whitespace and become spaces
_CLEAN = {c: None for c in [*range(0x20), 0x7F]} | {ord(c): " " for c in "\t\n\r"}
_PROBES = ("a", "hello world, again")  # texts whose special tokens tell where a text goes
# BERT's pre-tokenizer on cleaned ASCII text (its only whitespace a space): runs of other
# characters, and each ASCII punctuation character alone
_PUNCTUATION = r"!-/:-@\[-`{-~"
_WORDS = re.compile(f"[^ {_PUNCTUATION}]+|[{_PUNCTUATION}]")
WORD_CACHE_SIZE = 100_000  # words whose ids are kept (and one call's new ones): a few MB at most


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


class _AsciiPath:
    """ASCII text's ids without the library's normaliser, pre-tokenizer and post-processor: the
    words BERT's pre-tokenizer would split the normalised text into, each word's ids from a
    cache (the words missing from it tokenized by the library in one call), the specials around.
    A word's ids do not depend on its neighbours: the model reads each pre-token alone."""

    def __init__(
        self, normalize: AsciiNormalizer, specials: tuple[list[int], list[int]], bare: Tokenizer
    ) -> None:
        self.normalize = normalize
        self.prefix, self.suffix = specials
        self._bare = bare  # the library's tokenizer without normaliser and post-processor, no cut
        self._word_ids: dict[str, list[int]] = {}

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each (ASCII) text's ids, special tokens included, not cut."""
        words_of = [_WORDS.findall(self.normalize(text)) for text in texts]
        known = self._word_ids
        if len(known) >= WORD_CACHE_SIZE:  # bounded: start again with a new one, never emptying
            known = self._word_ids = {}  # one another thread is reading (engines share tokenizers)
        missing = list(set(chain.from_iterable(words_of)).difference(known))  # set and dict in C
        for word, encoding in zip(missing, _encode_all(self._bare, missing), strict=True):
            known[word] = encoding.ids
        word_ids, prefix, suffix = known.__getitem__, self.prefix, self.suffix
        return [list(chain(prefix, chain.from_iterable(map(word_ids, words)), suffix)) for words in words_of]


class IdsTokenizer:
    """The ids of texts, whole or cut at ``max_len`` (special tokens kept, as ``whole`` and ``cut``
    make them: the library's tokenizer without and with truncation at ``max_len``), and whether
    each was cut."""

    def __init__(self, whole: Tokenizer, cut: Tokenizer, max_len: int) -> None:
        self._library = {False: whole, True: cut}
        self._max_len = max_len
        self._ascii = _ascii_path(whole)

    def encode(self, texts: Sequence[str], cut: bool) -> list[tuple[list[int], bool]]:
        """Each text's ids and whether it was cut (``cut`` False: never), in the texts' order."""
        fast = self._ascii
        if fast is None:
            return self._by_library(texts, cut)
        ascii_texts = [i for i, text in enumerate(texts) if text.isascii()]
        longest = self._max_len if cut else sys.maxsize
        keep, suffix = self._max_len - len(fast.suffix), fast.suffix  # a cut one: its first ids, the suffix
        done = [
            (ids, False) if len(ids) <= longest else (ids[:keep] + suffix, True)
            for ids in fast.ids([texts[i] for i in ascii_texts])
        ]
        if len(ascii_texts) == len(texts):
            return done
        others = [i for i, text in enumerate(texts) if not text.isascii()]
        placed = dict(zip(ascii_texts, done, strict=True))
        placed |= dict(zip(others, self._by_library([texts[i] for i in others], cut), strict=True))
        return [placed[i] for i in range(len(texts))]

    def _by_library(self, texts: Sequence[str], cut: bool) -> list[tuple[list[int], bool]]:
        made = _encode_all(self._library[cut], texts)
        return [(e.ids, cut and len(e.ids) == self._max_len and bool(e.overflowing)) for e in made]


def _ascii_path(whole: Tokenizer) -> _AsciiPath | None:
    """The ASCII path where the tokenizer is BERT's (its normaliser cleaning text, its
    pre-tokenizer, special tokens around a text), else None."""
    normalize = AsciiNormalizer.of(whole)
    config = json.loads(whole.to_str())
    specials = single_specials(whole)
    bert_words = (config.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
    if normalize is None or not normalize.clean_text or specials is None or not bert_words:
        return None
    bare = Tokenizer.from_str(whole.to_str())
    bare.normalizer = None
    bare.post_processor = None
    bare.no_truncation()
    return _AsciiPath(normalize, specials, bare)


def _encode_all(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Encoding]:
    """Each text's encoding in one call, without offsets (the library's fast batch call)."""
    if len(texts) == 1:
        return [tokenizer.encode(texts[0])]
    return tokenizer.encode_batch_fast(list(texts)) if texts else []
