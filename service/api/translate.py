"""``POST /v1/translate``: its JSON ↔ the translation serving path (``service/serving/translation.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Request
from starlette.responses import Response

from service.api.dependencies import HttpClient, ServingRuntime, bearer_token
from service.api.error_responses import ERROR_RESPONSES
from service.api.glossaries import glossary_store, owner_key
from service.api.hot_path import hot
from service.api.schemas.common import json_response
from service.api.schemas.tserve import (
    DetectedLanguage,
    Hypothesis,
    SentenceResult,
    TranslateRequest,
    TranslateResponse,
    TranslateUsage,
    TranslationResult,
)
from service.engine.base import TranslationHypothesis
from service.serving import translation
from service.serving.detection import Detection
from service.serving.terminology import Terminology
from service.text.document import TextHypothesis, TextTranslation

router = APIRouter(tags=["translate"])


@router.post("/v1/translate", response_model=TranslateResponse, responses=ERROR_RESPONSES)
@hot
async def translate(body: TranslateRequest, request: Request, runtime: ServingRuntime) -> Response:
    """Translate one text or a list: each text sentence by sentence, in its own layout
    (all-or-nothing: one untranslatable text fails the request). The model is ``model``, else
    the one serving ``source_language`` → ``target_language``, else the default (the first).
    ``source_language`` "auto": each text from the language detected in it, reported with it."""
    asked = translation.TranslationRequest(
        texts=body.text,
        field="text",
        format=body.format,
        model=body.model,
        source=body.source_language,
        target=body.target_language,
        beam_size=body.beam_size,
        n_best=body.n_best,
        max_length=body.max_length,
        length_penalty=body.length_penalty,
        alignments=body.alignments,
        api_key=bearer_token(request),  # checked by require_api_key before the route runs
        terminology=Terminology(
            glossary_store(request),
            body.glossary,
            owner_key(request, [bearer_token(request)]),
            tuple(body.keep),
        ),
    )
    done = await translation.translate(runtime, HttpClient(request), asked)
    detected: Sequence[Detection | None] = done.detected or [None] * len(done.texts)  # source "auto" only
    return json_response(
        TranslateResponse(
            model=done.model,
            source_language=done.source_language,
            target_language=done.target_language,
            translations=[_result(t, body.alignments, d) for t, d in zip(done.texts, detected, strict=True)],
            usage=TranslateUsage(input_tokens=done.input_tokens, output_tokens=done.output_tokens),
        )
    )


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


def _result(text: TextTranslation, alignments: bool, detected: Detection | None) -> TranslationResult:
    sentences = text.sentences
    only = sentences[0] if len(sentences) == 1 and alignments else None  # its details at the top too
    return TranslationResult(
        hypotheses=[
            _hypothesis(h, only.hypotheses[min(k, len(only.hypotheses) - 1)] if only else None)
            for k, h in enumerate(text.hypotheses)
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
        detected_language=DetectedLanguage(language=detected.language, confidence=detected.confidence)
        if detected
        else None,
    )
