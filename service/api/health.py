"""Probes and metrics, never behind the API key.

``/health/live``: the process answers (restart it if not). ``/health/ready``: models loaded,
verified and warmed up, and not shutting down (send traffic only then).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.responses import Response

from service.api.dependencies import runtime_of
from service.api.schemas.common import json_response
from service.api.schemas.tserve import HealthResponse

router = APIRouter(tags=["health"])


@router.get("/health/live", response_model=HealthResponse)
async def live() -> Response:
    return json_response(HealthResponse(status="alive"))


@router.get("/health/ready", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def ready(request: Request) -> Response:
    runtime = runtime_of(request)
    body = HealthResponse(
        status=runtime.state, detail=runtime.detail, models=[e.manifest.name for e in runtime.engines] or None
    )
    return json_response(body, 200 if runtime.state == "ready" else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
