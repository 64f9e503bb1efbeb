"""The terminology test set: sentences of ``test_2016_flickr`` with term pairs their reference uses.

Term pairs come from a bilingual dictionary learned on Multi30k ``train`` alone (never on the
test set): every lowercased word of at least ``MIN_LETTERS`` letters, seen in at least
``MIN_COUNT`` training pairs, is paired with the target word it co-occurs with most, scored by
the Dice coefficient 2·c(s, t) / (c(s) + c(t)) over sentence pairs; a pair is kept when it is
each word's best (mutual) and scores at least ``MIN_DICE``. A word aligner (fast_align, eflomal,
SimAlign) would also find pairs below that score, but needs a tool this repository does not
carry, and the high-scoring mutual pairs are what a glossary holds: one fixed translation of a
content word. A test sentence takes a pair when its source has the source word and its
reference the target word, as the words are written there (the reference's casing: German
nouns are capitalised), so that a constrained translation that uses every term can be checked
exactly and its BLEU compared with the unconstrained one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import read_lines

MIN_LETTERS = 4
MIN_COUNT = 5
MIN_DICE = 0.5
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


@dataclass(frozen=True)
class TermSentence:
    source: str
    reference: str
    terms: tuple[tuple[str, str], ...]  # (source term, target term) as written in the sentence pair


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def learn_dictionary(
    sources: Sequence[str], targets: Sequence[str], min_count: int = MIN_COUNT, min_dice: float = MIN_DICE
) -> dict[str, str]:
    """Lowercased source word → lowercased target word: mutual best Dice pairs (module docstring)."""
    src_count: Counter[str] = Counter()
    tgt_count: Counter[str] = Counter()
    pair_count: Counter[tuple[str, str]] = Counter()
    for source, target in zip(sources, targets, strict=True):
        s = {w.lower() for w in words(source) if len(w) >= MIN_LETTERS}
        t = {w.lower() for w in words(target) if len(w) >= MIN_LETTERS}
        src_count.update(s)
        tgt_count.update(t)
        pair_count.update((a, b) for a in s for b in t)
    best_for_source: dict[str, tuple[float, str]] = {}
    best_for_target: dict[str, tuple[float, str]] = {}
    for (a, b), c in pair_count.items():
        if src_count[a] < min_count or tgt_count[b] < min_count:
            continue
        dice = 2 * c / (src_count[a] + tgt_count[b])
        # ties broken by the words themselves, so the dictionary is the same on every run
        if (dice, b) > best_for_source.get(a, (-1.0, "")):
            best_for_source[a] = (dice, b)
        if (dice, a) > best_for_target.get(b, (-1.0, "")):
            best_for_target[b] = (dice, a)
    return {
        a: b
        for a, (dice, b) in sorted(best_for_source.items())
        if dice >= min_dice and best_for_target[b][1] == a
    }


def term_sentences(
    sources: Sequence[str], references: Sequence[str], dictionary: dict[str, str], limit: int | None = None
) -> list[TermSentence]:
    """The sentences (in order, at most ``limit``) whose source and reference share dictionary
    pairs, each with those pairs as written in the sentence pair."""
    out: list[TermSentence] = []
    for source, reference in zip(sources, references, strict=True):
        in_reference = {w.lower(): w for w in words(reference)}
        terms: dict[str, tuple[str, str]] = {}
        for w in words(source):
            target = dictionary.get(w.lower())
            if target is not None and target in in_reference and w.lower() not in terms:
                terms[w.lower()] = (w, in_reference[target])
        if terms:
            out.append(TermSentence(source, reference, tuple(terms.values())))
            if limit is not None and len(out) == limit:
                break
    return out


def terminology_set(
    data_dir: Path, source_lang: str, target_lang: str, limit: int | None = None
) -> tuple[dict[str, str], list[TermSentence]]:
    """The dictionary learned on ``train`` and the ``test_2016_flickr`` sentences with terms."""
    m30k = data_dir / "multi30k"
    dictionary = learn_dictionary(
        read_lines(m30k / f"train.{source_lang}.gz"), read_lines(m30k / f"train.{target_lang}.gz")
    )
    sentences = term_sentences(
        read_lines(m30k / f"test_2016_flickr.{source_lang}.gz"),
        read_lines(m30k / f"test_2016_flickr.{target_lang}.gz"),
        dictionary,
        limit,
    )
    return dictionary, sentences


def term_accuracy(outputs: Sequence[str], sentences: Sequence[TermSentence]) -> float:
    """The share of required target terms present in the outputs, exactly as given (as a word)."""
    required = present = 0
    for output, sentence in zip(outputs, sentences, strict=True):
        found = set(words(output))
        for _, target in sentence.terms:
            required += 1
            present += target in found
    return present / required if required else 1.0
