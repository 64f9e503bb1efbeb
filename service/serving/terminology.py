"""A translation request's terminology: the glossary it names and the spans it keeps, turned
into what each of its sentences requires of its translation; and the store's refusals as the
serving layer's errors, which every API shape renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.glossaries.entries import Entry, GlossaryProblem
from service.glossaries.matching import TermMatcher
from service.glossaries.placeholders import Masked, mask
from service.glossaries.store import Glossary, GlossaryExists, GlossaryFull, GlossaryNotFound, GlossaryStore
from service.languages import canonical
from service.serving.failures import InvalidRequest, ServiceError, problem
from service.serving.runtime import Runtime


class UnknownGlossary(ServiceError, status=404, kind="glossary_not_found"):
    """No glossary of that id (or name, for the request's pair) that the API key may see."""


@dataclass(frozen=True)
class Terminology:
    """What a request asks: ``glossary`` (an id, or a name for the pair translated) from
    ``store``, seen as ``api_key``; ``keep``, spans left as they are."""

    store: GlossaryStore | None = None
    glossary: str | None = None
    api_key: str | None = None
    keep: tuple[str, ...] = ()
    field: str = "glossary"  # the glossary's field in the API's body, which errors name

    def for_pair(self, source: str, target: str) -> SentenceTerms:
        """The terms for sentences translated from ``source`` into ``target``: 404 for an
        unknown glossary, 422 for one of another language pair."""
        if self.glossary is None or self.store is None:
            return SentenceTerms(None, self.keep)
        try:
            found = self.store.find(self.api_key, self.glossary, source, target)
        except GlossaryNotFound as e:
            raise UnknownGlossary(str(e)) from e
        if (found.source_language, found.target_language) != (source, target):
            pair = f"{found.source_language}→{found.target_language}"
            message = f"glossary {found.id} is for {pair}; this request translates {source}→{target}"
            raise InvalidRequest([problem("glossary_language_pair", (self.field,), message, pair)])
        return SentenceTerms(found.matcher, self.keep)


# A phrase a sentence's translation must hold, and where it comes from in the (masked) sentence
Required = tuple[str, tuple[int, int]]


@dataclass(frozen=True)
class SentenceTerms:
    matcher: TermMatcher | None = None
    keep: tuple[str, ...] = ()

    def prepare(self, sentence: str) -> tuple[Masked, tuple[Required, ...]]:
        """``sentence`` with its kept spans masked, and the phrases its translation must hold,
        each once with its first span in the masked text (the engine places a phrase by the
        alignment of that span): each placeholder, then the target terms of the glossary's
        matches (in the masked text, so that a kept span is never also a glossary term)."""
        masked = mask(sentence, self.keep)
        found = [(p, masked.text.find(p)) for p in masked.placeholders]
        first = {p: (at, at + len(p)) for p, at in found if at >= 0}
        for match in self.matcher.matches(masked.text) if self.matcher is not None else ():
            first.setdefault(match.entry.target, (match.start, match.end))
        return masked, tuple(first.items())


def refused(error: GlossaryProblem) -> InvalidRequest:
    """A glossary the store will not keep, as a 422 naming the entry and the limit."""
    kind = (
        "glossary_full"
        if isinstance(error, GlossaryFull)
        else "glossary_exists"
        if isinstance(error, GlossaryExists)
        else "glossary_invalid"
    )
    loc = tuple(error.where.split(".")) if error.where.startswith("entries[") else (error.where,)
    return InvalidRequest([problem(kind, loc, error.message, error.limit)])


def create_glossary(
    runtime: Runtime,
    store: GlossaryStore,
    api_key: str | None,
    name: str,
    languages: tuple[str, str],
    entries: Sequence[Entry],
    language_fields: tuple[str, str] = ("source_language", "target_language"),
) -> Glossary:
    """A new glossary of ``languages`` (any codes; kept as listed codes) for ``api_key``: 422
    for a pair no model serves or entries the store refuses (every API's checks are these)."""
    source, target = (canonical(code) for code in languages)
    if not runtime.translation_models_for(source, target):
        served = ", ".join(
            f"{s}→{t}" for m in runtime.translation_models.values() for s in m.sources for t in m.targets
        )
        message = f"no model translates {source}→{target} (served: {served})"
        reads_source = any(source in m.sources for m in runtime.translation_models.values())
        field = language_fields[1] if reads_source else language_fields[0]
        raise InvalidRequest([problem("unsupported_language_pair", (field,), message, served)])
    try:
        return store.create(api_key, name, source, target, entries)
    except GlossaryProblem as e:
        raise refused(e) from e
