"""Translation, whichever API asked: route to a model → limits and the key's quota → segment →
the cache, else submit → assemble.

``/v1/translate``, LibreTranslate's ``/translate``, DeepL's ``/v2/translate`` and the file routes
differ only in how they spell a request and an answer; all build a ``TranslationRequest`` and get
the same model, limits, sentence batching, queue, deadline and errors. A source of ``AUTO``
("auto") is resolved here, for all of them: each text's language is detected
(``service/serving/detection.py``) and the texts of each language are translated from it, the
languages reported with the translation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import langcodes

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.translation.constraints import ConstraintUnsatisfiable
from service.languages import canonical
from service.serving.detection import AUTO, Detection, detect
from service.serving.failures import InvalidRequest, Problem, problem
from service.serving.limits import sentence_problems, translation_text_problems
from service.serving.routing import UnservedLanguages, choose_translation_model, translation_models
from service.serving.runtime import Runtime, TranslationModel
from service.serving.sentences import Format, split
from service.serving.submit import Client, all_or_nothing, submit
from service.serving.terminology import Terminology
from service.text.document import TextTranslation
from service.text.inline import Element

T = TypeVar("T")
NO_TERMINOLOGY = Terminology()
_SEGMENT = ("segment", "sentence segmentation and tokenization")
_TRANSLATE = ("translate", "queue wait and decoding (batched with other requests)")


@dataclass(frozen=True)
class TranslationRequest:
    """Texts to translate (all-or-nothing: one untranslatable text fails the request). ``field``
    is the texts' field in the API's body, which errors name. The model is ``model``, else the
    one serving ``source`` → ``target`` (see ``choose_translation_model`` for the two policies); None
    options are the model's own. A ``source`` of ``AUTO`` detects each text's language."""

    texts: list[str]
    field: str
    format: Format = "text"
    model: str | None = None
    source: str | None = None
    target: str | None = None
    beam_size: int = 4
    n_best: int = 1
    max_length: int | None = None
    length_penalty: float | None = None
    alignments: bool = False
    first_of_several: bool = False
    api_key: str | None = None  # the configured key that admitted it (``check_api_key``): its quota
    # The glossary it names and the spans it keeps: what each sentence's output must hold.
    terminology: Terminology = NO_TERMINOLOGY
    # Per text (none: no text has any): its inline elements, a document paragraph's runs, put on
    # its translation by the alignment where the model has one (``TextTranslation.placed``).
    elements: Sequence[Sequence[Element]] = ()

    def translation_model(self, runtime: Runtime, source: str | None) -> TranslationModel:
        """The model it goes to when translating from ``source``: its own, or one detected."""
        return choose_translation_model(
            runtime, self.model, source, self.target, first_of_several=self.first_of_several
        )


@dataclass(frozen=True)
class Translated:
    """A request's translation. With source "auto", ``model`` and ``source_language`` are the
    first text's (texts in several languages go to the models serving each), and ``detected``
    has each text's language; it is None for a source asked for or left to the model."""

    model: str
    source_language: str  # the one translated from: asked for, or the model's (first) one
    target_language: str
    texts: list[TextTranslation]
    detected: list[Detection] | None = None

    @property
    def input_tokens(self) -> int:
        return sum(t.n_input_tokens for t in self.texts)

    @property
    def output_tokens(self) -> int:
        return sum(t.n_output_tokens for t in self.texts)


async def translate(runtime: Runtime, client: Client, request: TranslationRequest) -> Translated:
    """``request`` translated, or the first step's refusal (``service.serving.failures``): from its
    source, or with source "auto" each text from the language detected in it."""
    if request.source == AUTO:
        return await _translate_detected(runtime, client, request)
    return await _translate_from(runtime, client, request)


async def _translate_from(runtime: Runtime, client: Client, request: TranslationRequest) -> Translated:
    """``request`` translated from its source (None: the model's)."""
    served = request.translation_model(runtime, request.source)
    source = canonical(request.source) if request.source else _first(served.sources)
    target = canonical(request.target) if request.target else _first(served.targets)
    options = _options(served, request, source, target)
    terms = request.terminology.for_pair(source, target)
    field, limits = request.field, runtime.limits
    _refuse(translation_text_problems(request.texts, field, limits))
    runtime.quotas.charge(request.api_key, sum(len(t) for t in request.texts), field)
    with client.timed(*_SEGMENT):
        sentences = await split(request.texts, request.format, source, served.engine, terms, request.elements)
    _refuse(sentences.html_problems(field))
    _refuse(sentence_problems(sentences.count, options.beam_size, options.max_length, field, limits))
    items, costs = sentences.items(options)
    results = await _cached_or_submitted(runtime, client, served, items, costs)
    return Translated(
        model=served.name,
        source_language=source,
        target_language=target,
        texts=all_or_nothing(_unless_unsatisfiable(sentences.assemble(results), field), field),
    )


def _unless_unsatisfiable(results: Sequence[T | Exception], field: str) -> Sequence[T | Exception]:
    """``results``, or a 422 naming every text with a sentence whose required phrases (glossary
    terms, kept spans) the model cannot write: a request to change, not the service's failure."""
    refused = [(i, r) for i, r in enumerate(results) if isinstance(r, ConstraintUnsatisfiable)]
    if refused:
        raise InvalidRequest([problem("constraint_unsatisfiable", (field, i), str(r)) for i, r in refused])
    return results


async def _cached_or_submitted(
    runtime: Runtime,
    client: Client,
    served: TranslationModel,
    items: list[TranslateItem],
    costs: list[int],
) -> list[Translation | Exception]:
    """Each sentence's translation: from the cache, else from the model's queue (only the
    sentences not found are submitted; each computed one is offered to the cache)."""
    cache = runtime.translation_cache
    keys = cache.keys(served.engine.manifest, runtime.settings.translate_shortlist, items)
    results: list[Translation | Exception | None] = list(cache.lookup(served.name, keys))
    missing = [i for i, found in enumerate(results) if found is None]
    timeout_s = runtime.settings.request_timeout_s
    computed = await submit(
        client,
        served.queue,
        [items[i] for i in missing],
        [costs[i] for i in missing],
        timeout_s,
        _TRANSLATE,
    )
    for i, result in zip(missing, computed, strict=True):
        results[i] = result
        cache.store(keys[i], result)
    return [r for r in results if r is not None]


def _first(languages: list[str]) -> str:
    return languages[0] if languages else ""


def _options(
    served: TranslationModel, request: TranslationRequest, source: str, target: str
) -> TranslateOptions:
    """The request's options, with the model's defaults, from ``source`` into ``target`` (listed
    codes): a multilingual model's language tokens; 422 for what this model cannot do (a language
    it does not serve, a longer output than it writes, alignments it lacks)."""
    info = served.engine.manifest.translation
    name = served.name
    problems = [
        *_language_problems(request.source and source, "source_language", served.sources, name),
        *_language_problems(request.target and target, "target_language", served.targets, name),
    ]
    if info is not None and request.max_length is not None and request.max_length > info.max_target_len:
        message = f"{name} writes at most {info.max_target_len} output tokens"
        problems.append(problem("less_than_equal", ("max_length",), message, info.max_target_len))
    if request.alignments and info is not None and not info.has_alignments:
        problems.append(problem("unsupported", ("alignments",), f"{name} has no alignments"))
    _refuse(problems)
    return TranslateOptions(
        beam_size=request.beam_size,
        n_best=request.n_best,
        max_length=request.max_length or (info.max_target_len if info else TranslateOptions.max_length),
        length_penalty=served.length_penalty if request.length_penalty is None else request.length_penalty,
        alignments=request.alignments,
        forced_first_token=served.languages.token(target),
        source_token=served.languages.token(source),
    )


def _language_problems(language: str | None, field: str, served: list[str], model: str) -> list[Problem]:
    if language is None or language in served:
        return []
    message = f"{language!r} is not served by {model} (serves: {', '.join(served)})"
    return [problem("unsupported_language", (field,), message, ", ".join(served))]


def _refuse(problems: list[Problem]) -> None:
    if problems:
        raise InvalidRequest(problems)


# ---- source "auto": each text translated from its detected language ---------------------------


class UntranslatableLanguage(InvalidRequest):
    """Texts detected as a language that no model translates into the target: a 422 naming
    each text, its language and the served pairs."""

    def __init__(self, refused: list[tuple[int, Detection]], field: str, target: str | None, served: str):
        into = f"into {target}" if target else "from it"
        problems = [
            problem(
                "unsupported_detected_language",
                (field, i),
                f"detected as {_name(d.language)} ({d.language}, confidence {d.confidence:g}%), which no "
                f"model translates {into} (served pairs: {served})",
                served,
            )
            for i, d in refused
        ]
        super().__init__(problems)
        self.refused = refused


async def _translate_detected(runtime: Runtime, client: Client, request: TranslationRequest) -> Translated:
    """``request`` with each text translated from the language detected in it. The text limits
    and the key's quota are checked before detection spends anything; then every text's language
    must be translatable into the target (else ``UntranslatableLanguage``, naming them all), and
    the texts of each language go through the translation path together, one language's texts
    beside another's (a client that leaves cancels them all)."""
    translation_models(runtime)  # 404 when there is no served, before any work
    _refuse(translation_text_problems(request.texts, request.field, runtime.limits))
    # One request for the key's quota, charged before detection spends anything; the parts
    # below are not charged again.
    runtime.quotas.charge(request.api_key, sum(len(t) for t in request.texts), request.field)
    request = replace(request, api_key=None)
    detected = await detect(runtime, request.texts, request.format)
    groups: dict[str, list[int]] = {}
    refused: list[tuple[int, Detection]] = []
    for i, detection in enumerate(detected):
        source = _source(runtime, request, detection)
        if source is None:
            refused.append((i, detection))
        else:
            groups.setdefault(source, []).append(i)
    if refused:
        raise UntranslatableLanguage(
            refused, request.field, request.target, ", ".join(runtime.served_pairs())
        )
    parts = [
        (indices, replace(request, texts=[request.texts[i] for i in indices], source=source))
        for source, indices in groups.items()
    ]
    if request.elements:
        parts = [(i, replace(part, elements=[request.elements[j] for j in i])) for i, part in parts]
    if len(parts) == 1:
        results = [await _translated(runtime, client, *parts[0], request.field)]
    else:
        together = _Together(client)
        results = await client.unless_gone(
            _all([_translated(runtime, together, indices, part, request.field) for indices, part in parts])
        )
    texts: list[Any] = [None] * len(request.texts)
    for (indices, _), result in zip(parts, results, strict=True):
        for i, text in zip(indices, result.texts, strict=True):
            texts[i] = text
    # groups are in the order of their first text: the first holds text 0
    return replace(results[0], texts=texts, detected=detected)


def _source(runtime: Runtime, request: TranslationRequest, detection: Detection) -> str | None:
    """The language to translate a text from: the detected one when a model (``request.model``,
    when named) translates it into the target; for an undetermined text the first such model's
    source; None when there is none. A target nothing writes, or several models to choose from,
    is ``choose_translation_model``'s refusal."""
    if detection.undetermined:
        served = choose_translation_model(runtime, request.model, None, request.target, first_of_several=True)
        return served.sources[0] if served.sources else None
    if not detection.served:
        return None
    try:
        served = request.translation_model(runtime, detection.language)
    except UnservedLanguages as refused:
        if refused.reason in ("source", "pair"):
            return None
        raise
    return detection.language if detection.language in served.sources else None


async def _translated(
    runtime: Runtime, client: Client, indices: list[int], part: TranslationRequest, field: str
) -> Translated:
    """``part`` (the texts at ``indices`` of the request) translated; its refusals name the texts
    by their index in the request."""
    try:
        return await _translate_from(runtime, client, part)
    except InvalidRequest as refused:
        problems = [_renumbered(p, field, indices) for p in refused.problems]
        raise InvalidRequest(problems, headers=refused.headers) from refused


def _renumbered(found: Problem, field: str, indices: list[int]) -> Problem:
    loc = tuple(found["loc"])
    if len(loc) >= 3 and loc[1] == field and isinstance(loc[2], int):
        return {**found, "loc": (*loc[:2], indices[loc[2]], *loc[3:])}
    return found


async def _all(works: list[Awaitable[T]]) -> list[T]:
    """Every work's result, run together; the first failure cancels the others (their queued
    sentences are dropped) and is raised."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()  # nothing for those done


class _Together:
    """The client of one language's texts run beside the others': the request's timings, and
    no watch of its own for the client leaving (the request's one watch covers them all)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def timed(self, stage: str, description: str) -> AbstractContextManager[None]:
        return self._client.timed(stage, description)

    async def unless_gone(self, work: Awaitable[T]) -> T:
        return await work


def _name(code: str) -> str:
    try:
        return str(langcodes.Language.get(code).display_name())
    except (ValueError, LookupError):
        return code
