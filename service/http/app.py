"""The FastAPI application: routes and middleware around the served models
(``service/serving/runtime.py``), which ``service/serving/startup.py`` loads, warms up and queues
in the background while the server already listens; ``/health/ready`` turns 200 once they are
ready.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.api import (
    deepl,
    deepl_documents,
    deepl_glossaries,
    detect,
    embed,
    files,
    glossaries,
    health,
    libretranslate,
    openai,
    rerank,
    tei,
    translate,
)
from service.api.dependencies import require_api_key
from service.api.error_responses import install_error_handlers
from service.api.hot_path import HotPath
from service.api.playground import install_playground
from service.glossaries.store import GlossaryStore, glossary_limits
from service.http.middleware import BodyLimitMiddleware, RequestContextMiddleware, ServerTimingMiddleware
from service.serving.runtime import Runtime
from service.serving.startup import GivenEngines, start
from service.settings import Settings


def create_app(
    settings: Settings,
    engines: GivenEngines | None = None,
    *,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app; ``engines`` replaces loading from artefacts: a list (several translation models,
    the default first, and at most one embedder) or a mapping keyed by task ("translate", "embed").

    ``on_fatal`` is called when the models cannot be loaded (``python -m service`` exits 1);
    without it the app stays up, not ready, and ``/health/ready`` says why.
    """
    runtime = Runtime(settings, on_fatal=on_fatal)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup = asyncio.create_task(start(runtime, engines), name="load-models")
        try:
            yield
        finally:
            runtime.begin_drain()
            startup.cancel()
            await asyncio.gather(startup, return_exceptions=True)
            await runtime.close(settings.shutdown_grace_s)

    app = FastAPI(
        title="Transformer serving",
        summary="Translation and sentence embeddings on onnxruntime, with dynamic batching",
        version="0.1.0",
        lifespan=lifespan,
        # Metrics are Prometheus's (service/metrics.py); FastAPI's OpenTelemetry bridge would
        # otherwise look its providers up on every request to find it has nothing to do.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.runtime = runtime
    app.state.glossaries = GlossaryStore(settings.glossary_dir, glossary_limits(settings))
    app.state.deepl_characters = Counter()  # /v2/usage's count per key (service/api/deepl.py)
    install_error_handlers(app)
    app.include_router(health.router)
    protected = [Depends(require_api_key)]
    for module in (translate, glossaries, embed, openai, rerank):
        app.include_router(module.router, dependencies=protected)
    app.include_router(libretranslate.router)  # its key may come in the body: checked in its routes
    app.include_router(detect.router)  # LibreTranslate's too
    app.include_router(deepl.router)  # DeepL's key header: checked in its routes
    app.include_router(deepl_glossaries.router)  # DeepL's too
    app.include_router(deepl_documents.router)
    app.include_router(files.router)  # /v1's behind the key; LibreTranslate's check theirs
    app.include_router(tei.router)  # answers in TEI's error shape, the key's refusals too
    if settings.playground:
        install_playground(app)  # open like /docs: the page asks for a key and sends it itself
    # Added first, so innermost: below every middleware, ahead of the router for the routes
    # marked hot (service/api/hot_path.py), which it finds among the app's when the app starts.
    app.add_middleware(HotPath, routes=app.routes)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After", "Server-Timing"],
        )
    app.add_middleware(ServerTimingMiddleware, path_prefixes=("/v1/", "/v2/", "/translate"))
    app.add_middleware(RequestContextMiddleware)  # outermost: sees every status, CORS and 413 included
    return app
