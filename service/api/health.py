"""Probes and metrics, never behind the API key.

``/health/live``: the process answers (restart it if not). ``/health/ready``: models loaded,
verified and warmed up, and not shutting down (send traffic only then); with several serving
processes, in every one of them.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from service.api.dependencies import runtime_of
from service.api.schemas.common import json_response
from service.api.schemas.tserve import HealthResponse
from service.metrics import exposition

router = APIRouter(tags=["health"])


@router.get("/health/live", response_model=HealthResponse)
async def live() -> Response:
    return json_response(HealthResponse(status="alive"))


@router.get("/health/ready", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def ready(request: Request) -> Response:
    runtime = runtime_of(request)
    state, detail = runtime.readiness()
    models = [e.manifest.name for e in runtime.engines] or None
    body = HealthResponse(status=state, detail=detail, models=models)
    return json_response(body, 200 if state == "ready" else 503)


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    # A plain def: FastAPI runs it on a thread, off the event loop, as several processes' values
    # are read from their files.
    return Response(exposition(runtime_of(request).settings.workers), media_type=CONTENT_TYPE_LATEST)
