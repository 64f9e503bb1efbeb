"""Translation, whichever API asked: route to a model → limits and the key's quota → segment →
the cache, else submit → assemble.

``/v1/translate`` and LibreTranslate's ``/translate`` differ only in how they spell a request and
an answer; both build a ``TranslationRequest`` and get the same model, limits, sentence batching,
queue, deadline and errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.constraints import ConstraintUnsatisfiable
from service.languages import canonical
from service.serving.errors import InvalidRequest, Problem, problem
from service.serving.limits import sentence_problems, translation_text_problems
from service.serving.routing import choose_translator
from service.serving.runtime import Runtime, ServedTranslator
from service.serving.sentences import Format, split
from service.serving.submit import Client, all_or_nothing, submit
from service.serving.terminology import Terminology
from service.text.document import TextTranslation

T = TypeVar("T")
NO_TERMINOLOGY = Terminology()
_SEGMENT = ("segment", "sentence segmentation and tokenization")
_TRANSLATE = ("translate", "queue wait and decoding (batched with other requests)")


@dataclass(frozen=True)
class TranslationRequest:
    """Texts to translate (all-or-nothing: one untranslatable text fails the request). ``field``
    is the texts' field in the API's body, which errors name. The model is ``model``, else the
    one serving ``source`` → ``target`` (see ``choose_translator`` for the two policies); None
    options are the model's own. A source to detect ("auto") is ``detection.translate_detected``'s."""

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

    def translator(self, runtime: Runtime, source: str | None) -> ServedTranslator:
        """The model it goes to when translating from ``source``: its own, or one detected."""
        return choose_translator(
            runtime, self.model, source, self.target, first_of_several=self.first_of_several
        )


@dataclass(frozen=True)
class Translated:
    model: str
    source_language: str  # the one translated from: asked for, or the model's (first) one
    target_language: str
    texts: list[TextTranslation]

    @property
    def input_tokens(self) -> int:
        return sum(t.n_input_tokens for t in self.texts)

    @property
    def output_tokens(self) -> int:
        return sum(t.n_output_tokens for t in self.texts)


async def translate(runtime: Runtime, client: Client, request: TranslationRequest) -> Translated:
    """``request`` translated, or the first step's refusal (``service.serving.errors``)."""
    translator = request.translator(runtime, request.source)
    source = canonical(request.source) if request.source else _first(translator.sources)
    target = canonical(request.target) if request.target else _first(translator.targets)
    options = _options(translator, request, source, target)
    terms = request.terminology.for_pair(source, target)
    field, limits = request.field, runtime.limits
    _refuse(translation_text_problems(request.texts, field, limits))
    runtime.quotas.charge(request.api_key, sum(len(t) for t in request.texts), field)
    with client.timed(*_SEGMENT):
        sentences = await split(request.texts, request.format, source, translator.engine, terms)
    _refuse(sentences.html_problems(field))
    _refuse(sentence_problems(sentences.count, options.beam_size, options.max_length, field, limits))
    items, costs = sentences.items(options)
    results = await _cached_or_submitted(runtime, client, translator, items, costs)
    return Translated(
        model=translator.name,
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
    translator: ServedTranslator,
    items: list[TranslateItem],
    costs: list[int],
) -> list[Translation | Exception]:
    """Each sentence's translation: from the cache, else from the model's queue (only the
    sentences not found are submitted; each computed one is offered to the cache)."""
    cache = runtime.translation_cache
    keys = cache.keys(translator.engine.manifest, runtime.settings.translate_shortlist, items)
    results: list[Translation | Exception | None] = list(cache.lookup(translator.name, keys))
    missing = [i for i, found in enumerate(results) if found is None]
    timeout_s = runtime.settings.request_timeout_s
    computed = await submit(
        client,
        translator.queue,
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
    translator: ServedTranslator, request: TranslationRequest, source: str, target: str
) -> TranslateOptions:
    """The request's options, with the model's defaults, from ``source`` into ``target`` (listed
    codes): a multilingual model's language tokens; 422 for what this model cannot do (a language
    it does not serve, a longer output than it writes, alignments it lacks)."""
    info = translator.engine.manifest.translation
    name = translator.name
    problems = [
        *_language_problems(request.source and source, "source_language", translator.sources, name),
        *_language_problems(request.target and target, "target_language", translator.targets, name),
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
        length_penalty=translator.length_penalty
        if request.length_penalty is None
        else request.length_penalty,
        alignments=request.alignments,
        forced_first_token=translator.languages.token(target),
        source_token=translator.languages.token(source),
    )


def _language_problems(language: str | None, field: str, served: list[str], model: str) -> list[Problem]:
    if language is None or language in served:
        return []
    message = f"{language!r} is not served by {model} (serves: {', '.join(served)})"
    return [problem("unsupported_language", (field,), message, ", ".join(served))]


def _refuse(problems: list[Problem]) -> None:
    if problems:
        raise InvalidRequest(problems)
