"""Stage ``terminology``: glossary terms enforced in the search, on a terminology test set.

The test set: sentences of ``test_2016_flickr`` with term pairs their reference uses.

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

The stage: each default translator's int8 export in-process, beam 4, batches of 32 (sentence
order), once free and once with each sentence's target terms required
(``TranslateOptions.required``, the same constraints a glossary puts on a request): sentences/s
(the constrained cost against the free one), the share of required terms present, BLEU against
the references, and the sentences refused as unsatisfiable. The quick run takes the first 96
sentences of each direction.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from benchmarks.common import read_lines
from benchmarks.harness import Bench, Need, Stage
from benchmarks.results import Figure, Row

MIN_LETTERS = 4
MIN_COUNT = 5
MIN_DICE = 0.5
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


@dataclass(frozen=True)
class TermSentence:
    source: str
    reference: str
    terms: tuple[tuple[str, str], ...]  # (source term, target term) as written in the sentence pair
    # The unseen set's: the dictionary's own target word each target term stands in for
    seen: tuple[str, ...] = ()


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


def has_term(output: str, term: str) -> bool:
    """Whether ``term`` stands in ``output`` exactly as given, as a word: no letter or digit
    touching it on either side (so "four" stands in "a four-wheeler", as a constrained search
    allows it, but not in "fourteen")."""
    return re.search(rf"(?<![^\W_]){re.escape(term)}(?![^\W_])", output) is not None


def _word(term: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![^\W_]){re.escape(term)}(?![^\W_])")


def source_span(source: str, term: str) -> tuple[int, int] | None:
    """The first place ``term`` stands in ``source`` as a word (what a glossary match gives)."""
    found = _word(term).search(source)
    return None if found is None else found.span()


# Made-up compounds stand for a user's domain terms: words the model never wrote in training.
UNSEEN_PREFIXES = {"de": ("Edel", "Pracht", "Zier", "Profi"), "en": ("mega", "ultra", "hyper", "proto")}


def german_nouns(lines: Sequence[str]) -> set[str]:
    """Lowercased German words written capitalised in most of their places inside a sentence."""
    upper: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for line in lines:
        for w in words(line)[1:]:
            seen[w.lower()] += 1
            upper[w.lower()] += w[0].isupper()
    return {w for w, n in seen.items() if 2 * upper[w] > n}


def unseen_terms(
    sentences: Sequence[TermSentence], train: tuple[Sequence[str], Sequence[str]], pair: tuple[str, str]
) -> list[TermSentence]:
    """The sentences' noun terms (as their German side says: ``german_nouns``), each target term
    replaced by a compound of it that no training target holds (``UNSEEN_PREFIXES``, the first
    that is absent), as a user's own domain term would be; sentences without one are left out."""
    german = pair.index("de")
    nouns = german_nouns(train[german])
    known = {w.lower() for line in train[1] for w in words(line)}
    replacement: dict[str, str] = {}
    out: list[TermSentence] = []
    for s in sentences:
        terms = [(source, target) for source, target in s.terms if (source, target)[german].lower() in nouns]
        for _, target in terms:
            if target not in replacement:
                stem = target.lower() if target[:1].isupper() else target
                made = (prefix + stem for prefix in UNSEEN_PREFIXES[pair[1]])
                replacement[target] = next(w for w in made if w.lower() not in known)
        if terms:
            unseen = tuple((source, replacement[target]) for source, target in terms)
            out.append(TermSentence(s.source, s.reference, unseen, tuple(target for _, target in terms)))
    return out


def with_terms(free: str, sentence: TermSentence) -> str:
    """``free`` with each dictionary word the unseen set replaced put in its term's place: what
    the translation should be with the user's words in it."""
    for (_, term), seen in zip(sentence.terms, sentence.seen, strict=True):
        free = _word(seen).sub(term, free, count=1)
    return free


_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def bolted_on(output: str, free: str, terms: Sequence[str]) -> bool:
    """Whether a term was bolted on: ``output`` has more sentences than the free translation, or
    a term stands only after its last sentence end ("Zwei Hunde spielen im Schnee. Köter")."""
    ends = [m.end() for m in _SENTENCE_END.finditer(output)]
    if len(ends) > max(1, len(_SENTENCE_END.findall(free))):
        return True
    last = ends[-1] if ends else len(output)
    return any(
        _word(t).search(output[:last]) is None and _word(t).search(output[last:]) is not None for t in terms
    )


def term_accuracy(outputs: Sequence[str], sentences: Sequence[TermSentence]) -> float:
    """The share of required target terms present in the outputs (``has_term``)."""
    required = present = 0
    for output, sentence in zip(outputs, sentences, strict=True):
        for _, target in sentence.terms:
            required += 1
            present += has_term(output, target)
    return present / required if required else 1.0


# --- the stage -------------------------------------------------------------------------------------

SECTION = "terminology: {pair}, test_2016_flickr sentences with dictionary terms, beam 4, batches of 32"
UNSEEN_SECTION = (
    "terminology: {pair}, the same sentences with terms the model never wrote in training, beam 4, "
    "batches of 32"
)
UNCONSTRAINED = "ours in-process (int8), free search"
CONSTRAINED = "ours in-process (int8), terms required, constrained search"
PLACED = "ours in-process (int8), terms required and placed by alignment (a glossary's)"
BATCH = 32


class Passes(Enum):
    FREE = UNCONSTRAINED
    CONSTRAINED = CONSTRAINED
    PLACED = PLACED


@dataclass(frozen=True)
class Pass:
    seconds: float
    outputs: list[str]
    unsatisfiable: int  # sentences refused (ConstraintUnsatisfiable): their output counts as empty


def batches(system: Any, sentences: Sequence[TermSentence], how: Passes) -> list[list[Any]]:
    """The pass's batches of ``BATCH`` items (sentence order), beam 4, each batch's output limit
    as the translation stage's natural runs; but for a free pass, each sentence's target terms
    required (placed: with the source terms' spans, as a glossary's matches give them). Made
    once, before any pass is timed."""
    from service.engine.base import TranslateItem, TranslateOptions

    out = []
    for at in range(0, len(sentences), BATCH):
        chunk = sentences[at : at + BATCH]
        max_len = min(256, 2 * max(len(e.ids) for e in system.engine.encode([s.source for s in chunk])) + 10)
        items = []
        for s in chunk:
            required = () if how is Passes.FREE else tuple(t for _, t in s.terms)
            spans = tuple(source_span(s.source, term) for term, _ in s.terms) if how is Passes.PLACED else ()
            options = TranslateOptions(
                beam_size=4, max_length=max_len, required=required, required_sources=spans
            )
            items.append(TranslateItem(s.source, options))
        out.append(items)
    return out


def translate_pass(system: Any, batched: Sequence[Sequence[Any]]) -> Pass:
    """One timed pass over ``batches``' batches."""
    from service.engine.base import Translation

    outputs: list[str] = []
    unsatisfiable, start = 0, time.perf_counter()
    for items in batched:
        for result in system.dealt_out(items):
            if isinstance(result, Translation):
                outputs.append(result.hypotheses[0].text)
            elif isinstance(result, ValueError):  # ConstraintUnsatisfiable, that sentence only
                outputs.append("")
                unsatisfiable += 1
            else:
                raise result
    return Pass(time.perf_counter() - start, outputs, unsatisfiable)


def best_pass(bench: Bench, system: Any, sentences: Sequence[TermSentence], how: Passes) -> Pass:
    batched = batches(system, sentences, how)
    translate_pass(system, batched[:1])  # warm-up
    return min((translate_pass(system, batched) for _ in range(bench.rounds)), key=lambda p: p.seconds)


UNSEEN_FIGURES = {Passes.FREE: Figure.TERMS_UNSEEN_FREE, Passes.PLACED: Figure.TERMS_UNSEEN_PLACED}


def measure(
    bench: Bench, system: Any, sentences: Sequence[TermSentence], section: str, figures: bool = False
) -> None:
    """The three passes of a set: sent/s, the terms' accuracy; for the dictionary set BLEU against
    the references, for the unseen set (its sentences name the words they replaced) the share
    bolted on and BLEU / chrF against the free translation with the terms in place."""
    import sacrebleu

    unseen = any(s.seen for s in sentences)
    free = best_pass(bench, system, sentences, Passes.FREE)
    if unseen:
        references = [[with_terms(out, s) for out, s in zip(free.outputs, sentences, strict=True)]]
    else:
        references = [[s.reference for s in sentences]]
    for how in Passes:
        best = free if how is Passes.FREE else best_pass(bench, system, sentences, how)
        extra: dict[str, float] = {
            "sentences": len(sentences),
            "terms": sum(len(s.terms) for s in sentences),
            "term_accuracy_pct": round(100 * term_accuracy(best.outputs, sentences), 2),
            "unsatisfiable": best.unsatisfiable,
        }
        bleu = round(sacrebleu.corpus_bleu(best.outputs, references).score, 2)
        if unseen:
            bolted = sum(
                bolted_on(out, f, [t for _, t in s.terms])
                for out, f, s in zip(best.outputs, free.outputs, sentences, strict=True)
            )
            extra["bolted_on_pct"] = round(100 * bolted / len(sentences), 2)
            extra["bleu_vs_free_with_terms"] = bleu
            extra["chrf_vs_free_with_terms"] = round(sacrebleu.corpus_chrf(best.outputs, references).score, 2)
        else:
            extra["bleu"] = bleu
        row = Row(
            section,
            how.value,
            len(sentences) / best.seconds,
            "sent/s",
            baseline=how is Passes.FREE,
            extra=extra,
            figure=UNSEEN_FIGURES.get(how) if figures else None,
        )
        bench.results.add(row)


def run(bench: Bench) -> None:
    from benchmarks.translators import OursInProcess
    from service.artefacts import read_manifest
    from service.settings import DEFAULT_TRANSLATE_MODELS

    for name in DEFAULT_TRANSLATE_MODELS:
        artefact = bench.models.get(f"{name}/int8")
        translation = None if artefact is None else read_manifest(artefact).translation
        if artefact is None or translation is None:
            bench.results.note(f"terminology: {name} not measured (no int8 export)")
            continue
        pair = (translation.source_languages[0], translation.target_languages[0])
        _, sentences = terminology_set(bench.args.data_dir, *pair, limit=96 if bench.quick else None)
        systems = bench.system(OursInProcess, artefact, bench.threads, UNCONSTRAINED)
        if not systems or not sentences:
            continue
        print(f"== terminology: {name}, {len(sentences)} sentences", flush=True)
        measure(bench, systems[0], sentences, SECTION.format(pair="→".join(pair)))
        m30k = bench.args.data_dir / "multi30k"
        train = (read_lines(m30k / f"train.{pair[0]}.gz"), read_lines(m30k / f"train.{pair[1]}.gz"))
        unseen = unseen_terms(sentences, train, pair)
        if not unseen:
            bench.results.note(f"terminology: {name}'s sentences have no noun terms for the unseen set")
            continue
        first = name == DEFAULT_TRANSLATE_MODELS[0]  # the targets read the first direction's
        measure(bench, systems[0], unseen, UNSEEN_SECTION.format(pair="→".join(pair)), first)


STAGE = Stage(
    "terminology",
    "terminology: glossary terms enforced in the search",
    frozenset({Need.DEFAULT_TRANSLATORS}),
    run,
)
