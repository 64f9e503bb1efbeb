"""LibreTranslate's ``POST /detect``: which language ``q`` is written in.

The body is LibreTranslate's (JSON or a form; ``q`` one text or a list; ``api_key`` optional),
and so is the answer: a list of ``{"confidence": 0–100, "language": code}``, best first. For a
list of texts LibreTranslate merges the texts' candidates into that one list; here each
language's confidence is its mean over the texts weighted by their lengths (0 where it is not a
candidate). The candidates are the languages the served models read or write, and a text
plainly in another language is reported as that language first
(``service/serving/detection.py``). The texts are bounded by the same limits as a translation's.
"""

from __future__ import annotations

from collections import defaultdict

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from service.api.dependencies import runtime_of
from service.api.error_responses import answer, http_failure, libretranslate_error
from service.api.libretranslate import admitted_body, error_responses
from service.api.schemas.common import json_or_form
from service.api.schemas.libretranslate import DetectRequest, LibreTranslateDetection
from service.serving import detection
from service.serving.access import ready
from service.serving.failures import SERVING_ERRORS, InvalidRequest
from service.serving.limits import translation_text_problems
from service.serving.routing import translation_models

router = APIRouter(tags=["libretranslate"])


@router.post(
    "/detect",
    response_model=list[LibreTranslateDetection],
    responses=error_responses(400, 403, 413, 415, 503),
    openapi_extra=json_or_form(DetectRequest),
)
async def detect(request: Request) -> Response:
    """The language of ``q`` (a string or a list) among those served: candidates, best first."""
    runtime = runtime_of(request)
    try:
        body, _, _ = await admitted_body(request, DetectRequest)
        translation_models(ready(runtime))
        problems = translation_text_problems(body.q, "q", runtime.limits)
        if problems:
            raise InvalidRequest(problems)
        found = await detection.detect(runtime, body.q)
    except HTTPException as e:  # the body stream's limits (413, 408)
        return libretranslate_error(http_failure(e))
    except SERVING_ERRORS as e:
        return answer(request, e, libretranslate_error)
    return JSONResponse(
        [{"confidence": c, "language": code} for code, c in _merged(found, [len(t) for t in body.q])]
    )


def _merged(found: list[detection.Detection], weights: list[int]) -> list[tuple[str, float]]:
    """One text's ranking; for several, each language's length-weighted mean confidence, best
    first (ties in the order the candidates first appear)."""
    if len(found) == 1:
        return list(found[0].ranking)
    total = sum(weights)
    sums: dict[str, float] = defaultdict(float)
    for one, weight in zip(found, weights, strict=True):
        for code, confidence in one.ranking:
            sums[code] += confidence * weight
    merged = [(code, round(s / total, 2)) for code, s in sums.items()]
    return sorted(merged, key=lambda pair: -pair[1])
