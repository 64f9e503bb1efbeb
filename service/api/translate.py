"""``POST /v1/translate``: JSON ↔ texts, through sentence segmentation and the translation batcher."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.api.dependencies import serving_runtime, until_disconnect
from service.api.errors import ERROR_RESPONSES, ModelNotFound, unpack_results, validation_error
from service.api.gated_route import GatedRoute
from service.api.middleware import timed_stage
from service.api.schemas import (
    Hypothesis,
    SentenceResult,
    TranslateRequest,
    TranslateResponse,
    TranslateUsage,
    TranslationResult,
    check_language,
    check_texts,
    json_response,
)
from service.engine.base import TranslateOptions, TranslationHypothesis
from service.lifecycle import Runtime, ServedTranslator
from service.text.document import TextHypothesis, TextTranslation
from service.text.pipeline import Format, prepare, translate_documents

router = APIRouter(tags=["translate"], route_class=GatedRoute)


def route(runtime: Runtime, model: str | None, source: str | None, target: str | None) -> ServedTranslator:
    """The model a request names, else the one serving its languages (the default when it names
    none): 404 for a model not served, 422 for a pair nobody or several models serve."""
    if not runtime.translators:
        raise ModelNotFound("no translation model is loaded (TSERVE_TRANSLATE_MODELS is empty)")
    if model is not None:
        if model not in runtime.translators:
            raise ModelNotFound(
                f"the model {model!r} is not served here; translators: {', '.join(runtime.translators)}"
            )
        return runtime.translators[model]
    if source is None and target is None:
        return next(iter(runtime.translators.values()))  # the default: the first configured
    matches = runtime.translators_for(source, target)
    if len(matches) == 1:
        return matches[0]
    served = ", ".join(runtime.served_pairs())
    if matches:
        kind, field = (
            "ambiguous_language_pair",
            "target_language" if target is not None else "source_language",
        )
        message = f"{', '.join(t.name for t in matches)} all translate this: name one in 'model'"
    elif source is not None and not runtime.translators_for(source, None):
        kind, field = "unsupported_language_pair", "source_language"
        message = f"{source!r} is not served as a source language"
    elif target is not None and not runtime.translators_for(None, target):
        kind, field = "unsupported_language_pair", "target_language"
        message = f"{target!r} is not served as a target language"
    else:
        kind, field = "unsupported_language_pair", "target_language"
        message = f"{source!r} → {target!r} is not served"
    error = {"type": kind, "loc": ("body", field), "msg": f"{message} (served pairs: {served})"}
    raise validation_error([{**error, "ctx": {"limit": served}}])


@router.post("/v1/translate", response_model=TranslateResponse, responses=ERROR_RESPONSES)
async def translate(
    body: TranslateRequest,
    request: Request,
    runtime: Annotated[Runtime, Depends(serving_runtime)],
) -> Response:
    """Translate one text or a list: each text sentence by sentence, in its own layout
    (all-or-nothing: one untranslatable text fails the request). The model is ``model``, else
    the one serving ``source_language`` → ``target_language``, else the default (the first)."""
    translator = route(runtime, body.model, body.source_language, body.target_language)
    manifest = translator.engine.manifest
    info = manifest.translation
    sources = translator.sources
    targets = translator.targets
    errors = [
        *check_language(body.source_language, "source_language", sources, manifest.name),
        *check_language(body.target_language, "target_language", targets, manifest.name),
    ]
    if info is not None and body.max_length is not None and body.max_length > info.max_target_len:
        errors.append(
            {
                "type": "less_than_equal",
                "loc": ("body", "max_length"),
                "msg": f"{manifest.name} writes at most {info.max_target_len} output tokens",
                "ctx": {"limit": info.max_target_len},
            }
        )
    if body.alignments and info is not None and not info.has_alignments:
        errors.append(
            {
                "type": "unsupported",
                "loc": ("body", "alignments"),
                "msg": f"{manifest.name} has no alignments",
            }
        )
    if errors:
        raise validation_error(errors)
    options = TranslateOptions(
        beam_size=body.beam_size,
        n_best=body.n_best,
        max_length=body.max_length or (info.max_target_len if info else TranslateOptions.max_length),
        length_penalty=body.length_penalty if body.length_penalty is not None else translator.length_penalty,
        alignments=body.alignments,
    )
    source_language = body.source_language or (sources[0] if sources else "")
    translations = await translate_texts(
        request, runtime, translator, body.text, "text", body.format, source_language, options
    )
    return json_response(
        TranslateResponse(
            model=manifest.name,
            source_language=source_language,
            target_language=body.target_language or (targets[0] if targets else ""),
            translations=[_result(t, body.alignments) for t in translations],
            usage=TranslateUsage(
                input_tokens=sum(t.n_input_tokens for t in translations),
                output_tokens=sum(t.n_output_tokens for t in translations),
            ),
        )
    )


async def translate_texts(
    request: Request,
    runtime: Runtime,
    translator: ServedTranslator,
    texts: list[str],
    field: str,
    fmt: Format,
    language: str,
    options: TranslateOptions,
) -> list[TextTranslation]:
    """Check the request's size, segment, translate; 422 (``RequestValidationError``) naming
    ``field`` for texts or sentences over the limits and HTML that cannot be kept."""
    limits = runtime.limits
    errors = check_texts(texts, field, limits)
    total = sum(len(t) for t in texts)
    if not errors and total > limits.max_translate_chars:
        errors = [
            {
                "type": "too_long",
                "loc": ("body", field),
                "msg": f"at most {limits.max_translate_chars} characters per request, got {total}",
                "ctx": {"limit": limits.max_translate_chars},
            }
        ]
    if errors:
        raise validation_error(errors)
    with timed_stage(request.scope, "segment", "sentence segmentation and tokenization"):
        prepared = await prepare(texts, fmt, language, translator.engine)
    html_errors: list[dict[str, Any]] = [
        {"type": "html_invalid", "loc": ("body", field, i), "msg": str(d)}
        for i, d in enumerate(prepared.documents)
        if isinstance(d, Exception)
    ]
    if html_errors:
        raise validation_error(html_errors)
    max_sentences = min(limits.max_sentences, runtime.settings.max_queue)
    n = prepared.n_sentences
    if n > max_sentences:
        raise validation_error(
            [
                {
                    "type": "too_many_sentences",
                    "loc": ("body", field),
                    "msg": f"at most {max_sentences} sentences per request, got {n}",
                    "ctx": {"limit": max_sentences},
                }
            ]
        )
    cost = n * options.beam_size * options.max_length
    if cost > limits.max_decode_cost:
        raise validation_error(
            [
                {
                    "type": "decode_cost_too_high",
                    "loc": ("body", field),
                    "msg": f"{n} sentences × beam_size {options.beam_size} × max_length {options.max_length} "
                    f"= {cost} output tokens to search, more than {limits.max_decode_cost}: lower "
                    "beam_size or max_length, or send fewer sentences per request",
                    "ctx": {"limit": limits.max_decode_cost},
                }
            ]
        )
    with timed_stage(request.scope, "translate", "queue wait and decoding (batched with other requests)"):
        results = await until_disconnect(
            request,
            translate_documents(translator.batcher, prepared, options, runtime.settings.request_timeout_s),
        )
    return unpack_results(results, field)


def _hypothesis(
    h: TranslationHypothesis | TextHypothesis, detail: TranslationHypothesis | None
) -> Hypothesis:
    """``h``'s text and score, with ``detail``'s tokens and alignment when asked for."""
    return Hypothesis(
        text=h.text,
        score=h.score,
        tokens=detail.tokens if detail else None,
        alignment=detail.alignment if detail else None,
    )


def _result(translation: TextTranslation, alignments: bool) -> TranslationResult:
    sentences = translation.sentences
    only = sentences[0] if len(sentences) == 1 and alignments else None  # its details at the top too
    return TranslationResult(
        hypotheses=[
            _hypothesis(h, only.hypotheses[min(k, len(only.hypotheses) - 1)] if only else None)
            for k, h in enumerate(translation.hypotheses)
        ],
        source_tokens=only.source_tokens if only else None,
        sentences=[
            SentenceResult(
                source=s.source,
                start=s.span[0] if s.span else None,
                end=s.span[1] if s.span else None,
                pieces=s.pieces,
                hypotheses=[_hypothesis(h, h if alignments else None) for h in s.hypotheses],
                source_tokens=s.source_tokens if alignments else None,
            )
            for s in sentences
        ],
    )
