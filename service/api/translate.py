"""``POST /v1/translate``: JSON ↔ ``TranslateItem``s, through the translation batcher."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.api.errors import ERROR_RESPONSES, ModelNotFound, unpack_results, validation_error
from service.api.runtime import Runtime, Translator, ready_runtime, until_disconnect
from service.api.schemas import (
    Hypothesis,
    TranslateRequest,
    TranslateResponse,
    TranslateUsage,
    TranslationResult,
    check_language,
    check_texts,
    json_response,
)
from service.engine.base import TranslateItem, TranslateOptions, Translation

router = APIRouter(tags=["translate"])


def _translator(runtime: Annotated[Runtime, Depends(ready_runtime)]) -> Translator:
    if runtime.translator is None:
        raise ModelNotFound("no translation model is loaded (TSERVE_TRANSLATE_MODEL is empty)")
    return runtime.translator


@router.post("/v1/translate", response_model=TranslateResponse, responses=ERROR_RESPONSES)
async def translate(
    body: TranslateRequest,
    request: Request,
    runtime: Annotated[Runtime, Depends(ready_runtime)],
    translator: Annotated[Translator, Depends(_translator)],
) -> Response:
    """Translate one text or a list (all-or-nothing: one untranslatable text fails the request)."""
    manifest = translator.engine.manifest
    info = manifest.translation
    sources = info.source_languages if info else []
    targets = info.target_languages if info else []
    errors = [
        *check_texts(body.text, "text", runtime.limits),
        *check_language(body.source_language, "source_language", sources, manifest.name),
        *check_language(body.target_language, "target_language", targets, manifest.name),
    ]
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
        max_length=body.max_length,
        length_penalty=body.length_penalty,
        alignments=body.alignments,
    )
    items = [TranslateItem(text=text, options=options) for text in body.text]
    results = await until_disconnect(
        request, translator.batcher.submit(items, runtime.settings.request_timeout_s)
    )
    translations: list[Translation] = unpack_results(results, "text")
    return json_response(
        TranslateResponse(
            model=manifest.name,
            source_language=body.source_language or (sources[0] if sources else ""),
            target_language=body.target_language or (targets[0] if targets else ""),
            translations=[_result(t, body.alignments) for t in translations],
            usage=TranslateUsage(
                input_tokens=sum(t.n_input_tokens for t in translations),
                output_tokens=sum(t.n_output_tokens for t in translations),
            ),
        )
    )


def _result(translation: Translation, alignments: bool) -> TranslationResult:
    return TranslationResult(
        hypotheses=[
            Hypothesis(
                text=h.text,
                score=h.score,
                tokens=h.tokens if alignments else None,
                alignment=h.alignment if alignments else None,
            )
            for h in translation.hypotheses
        ],
        source_tokens=translation.source_tokens if alignments else None,
    )
