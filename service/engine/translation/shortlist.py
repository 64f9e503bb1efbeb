"""Vocabulary shortlists (CTranslate2's ``vmap``): each sentence decodes over the target tokens its
source can map to instead of the whole vocabulary.

The map is CTranslate2's text format, one rule a line::

    src_1 src_2 … src_n <TAB> tgt_1 tgt_2 … tgt_m

a source n-gram (tokens of the model's tokenizer, space-separated) and the target tokens it
allows; the line with an empty n-gram lists tokens every sentence may use. A sentence's shortlist
is those, the model's special tokens, and the targets of every n-gram of its source that has a
rule. A vmap made for CTranslate2 from the same vocabulary works as it is.

Unlike CTranslate2, which restricts a whole batch to the union of its sentences' lists (so a
translation changes with what shares its batch), each sentence keeps its own list: the decoder
step scores the union of the running sentences' lists and masks every row to its own sentence's
(``StepVocabulary``, ``decoder_shortlist.onnx``: export/graphs/shortlist.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from service.artefacts import ArtefactError

log = logging.getLogger(__name__)


class VocabularyMap:
    """Source n-grams → the target ids they allow, and the ids every sentence may use."""

    def __init__(self, rules: dict[str, np.ndarray], always: Iterable[int], max_n: int) -> None:
        self.rules = rules  # "tok1 tok2" → ascending int64 ids
        self.always = np.unique(np.fromiter(always, dtype=np.int64))
        self.max_n = max_n

    @classmethod
    def whole(cls, vocab_size: int) -> VocabularyMap:
        """Every token allowed in every sentence: the shortlist step then is the plain one."""
        return cls({}, range(vocab_size), 0)

    @classmethod
    def read(cls, path: Path, token_id: Callable[[str], int | None], special: Iterable[int]) -> VocabularyMap:
        """Parse ``path``; ``token_id`` maps a target token to its id (None: not in the
        vocabulary, skipped as CTranslate2 maps it to <unk>); ``special`` ids are always allowed."""
        rules: dict[str, set[int]] = {}
        unknown: set[str] = set()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ArtefactError(f"{path}: cannot read the vocabulary map: {e}") from e
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            source, tab, targets = line.partition("\t")
            if not tab:
                raise ArtefactError(f"{path}:{number}: no tab between the source n-gram and its targets")
            ids = rules.setdefault(" ".join(source.split()), set())
            for token in targets.split():
                i = token_id(token)
                if i is None:
                    unknown.add(token)
                else:
                    ids.add(i)
        if unknown:
            log.warning("%s: %d target tokens are not in the vocabulary, skipped", path, len(unknown))
        always = [*special, *rules.pop("", ())]
        max_n = max((key.count(" ") + 1 for key in rules), default=0)
        return cls({k: np.array(sorted(v), dtype=np.int64) for k, v in rules.items()}, always, max_n)

    def shortlist(self, source_tokens: Sequence[str]) -> np.ndarray:
        """The ascending target ids a sentence of these source tokens may produce."""
        found = [self.always]
        for i in range(len(source_tokens)):
            for n in range(1, min(self.max_n, len(source_tokens) - i) + 1):
                ids = self.rules.get(" ".join(source_tokens[i : i + n]))
                if ids is not None:
                    found.append(ids)
        return np.unique(np.concatenate(found))


class StepVocabulary:
    """What ``decoder_shortlist.onnx`` is fed at a step: ``vocabulary``, the union of the running
    sentences' shortlists (ascending), and ``mask`` (rows, len(vocabulary)) bool, whether the
    row's own sentence allows the token."""

    def __init__(self) -> None:
        self._lists: dict[int, np.ndarray] = {}  # sentence → its shortlist
        self._members = np.zeros(0, dtype=np.int64)  # the sentences the union is made of
        self._member_masks = np.zeros((0, 0), dtype=bool)  # (members, vocabulary) each one's mask row
        self._row_sentences = np.zeros(0, dtype=np.int64)
        self.vocabulary = np.zeros(0, dtype=np.int64)
        self.mask = np.zeros((0, 0), dtype=bool)

    def add(self, sentence: int, ids: np.ndarray) -> None:
        self._lists[sentence] = ids

    def update(self, row_sentences: np.ndarray) -> bool:
        """Bring ``vocabulary`` and ``mask`` up to date for rows holding ``row_sentences``; →
        True when either is a new array (to bind again), False when ``mask`` changed in place
        or not at all."""
        members = np.unique(row_sentences)
        replaced = False
        if not np.array_equal(members, self._members):
            self._lists = {s: self._lists[s] for s in members.tolist()}  # the others have left
            lists = [self._lists[s] for s in members.tolist()]
            self.vocabulary = np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int64)
            self._member_masks = np.zeros((len(lists), len(self.vocabulary)), dtype=bool)
            for row, ids in zip(self._member_masks, lists, strict=True):
                row[np.searchsorted(self.vocabulary, ids)] = True
            self._members, replaced = members, True
        if replaced or not np.array_equal(row_sentences, self._row_sentences):
            mask = self._member_masks[np.searchsorted(self._members, row_sentences)]
            if replaced or mask.shape != self.mask.shape:
                self.mask, replaced = mask, True
            else:
                self.mask[...] = mask  # the binding holds this array
            self._row_sentences = row_sentences.copy()
        return replaced
