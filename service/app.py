"""The FastAPI application: routes, middleware, and the model lifecycle.

The server listens at once; models load in the background (exporting them first in a
subprocess when allowed), get verified and warmed up, and only then does ``/health/ready``
turn 200. So liveness probes pass during a long first start, and readiness gates traffic.
The service never imports torch: the export step is another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.api import embed, health, libretranslate, openai, translate
from service.api.errors import install_error_handlers
from service.api.middleware import BodyLimitMiddleware, RequestContextMiddleware, ServerTimingMiddleware
from service.api.playground import install_playground
from service.api.runtime import Runtime, require_api_key
from service.artefacts import MANIFEST_NAME, ArtefactError, read_manifest
from service.engine.base import Engine
from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS, Settings

log = logging.getLogger(__name__)

_TAIL_LINES = 20  # of the export's output, quoted when it fails
_EXPORTED_BY_DEFAULT = {*DEFAULT_TRANSLATE_MODELS, DEFAULT_EMBED_MODEL}  # `python -m export default`

GivenEngines = Mapping[str, Engine] | Sequence[Engine]


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
        startup = asyncio.create_task(_start(runtime, engines), name="load-models")
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
    install_error_handlers(app)
    app.include_router(health.router)
    protected = [Depends(require_api_key)]
    for module in (translate, embed, openai):
        app.include_router(module.router, dependencies=protected)
    app.include_router(libretranslate.router)  # its key may come in the body: checked in its routes
    if settings.playground:
        install_playground(app)  # open like /docs: the page asks for a key and sends it itself
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After", "Server-Timing"],
        )
    app.add_middleware(ServerTimingMiddleware, path_prefixes=("/v1/", "/translate"))
    app.add_middleware(RequestContextMiddleware)  # outermost: sees every status, CORS and 413 included
    return app


async def _start(runtime: Runtime, given: GivenEngines | None) -> None:
    """Load (or take), warm up, then attach batchers; any failure is fatal and explained."""
    try:
        engines = _check_given(given) if given is not None else await load_engines(runtime.settings)
        names = [e.manifest.name for e in engines]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # names are the routes' `model` and the metrics' `model` label
            raise ArtefactError(f"more than one engine named {', '.join(repeated)}")
        for engine in engines:
            await asyncio.to_thread(engine.warmup)
        runtime.attach(engines)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        runtime.fail(e)


def _check_given(given: GivenEngines) -> list[Engine]:
    """The engines in order; a task key must match its engine, and one embedder at most."""
    if isinstance(given, Mapping):
        for key, engine in given.items():
            if key != engine.manifest.task:
                raise ArtefactError(
                    f"engine {engine.manifest.name!r} given as {key!r} is a {engine.manifest.task}"
                )
        given = list(given.values())
    if sum(e.manifest.task == "embed" for e in given) > 1:
        raise ArtefactError("at most one embedding engine is served")
    return list(given)


async def load_engines(settings: Settings) -> list[Engine]:
    """``artefact_root/<model>/<variant>`` for each configured model, exported first if missing
    (one export subprocess for all of them; it knows only the default models)."""
    provider = settings.resolved_provider()
    variant = settings.resolved_variant(provider)
    wanted = [("translate", name) for name in settings.translation_models]
    if settings.embed_model:
        wanted.append(("embed", settings.embed_model))
    missing = [n for _, n in wanted if not (settings.model_dir(n, variant) / MANIFEST_NAME).is_file()]
    stale = [n for _, n in wanted if n not in missing and _unchecked(settings.model_dir(n, variant))]
    not_exportable = [n for n in missing if n not in _EXPORTED_BY_DEFAULT]
    if not_exportable:
        raise ArtefactError(
            f"no {variant} artefacts for {', '.join(not_exportable)} under {settings.artefact_root}, "
            f"and the auto-export makes only the default models ({', '.join(sorted(_EXPORTED_BY_DEFAULT))}): "
            f"run `python -m export SOURCE --name NAME --out {settings.artefact_root} --variant {variant}`"
        )
    if missing and not settings.auto_export:
        raise ArtefactError(
            f"no {variant} artefacts for {', '.join(missing)} under {settings.artefact_root}: run "
            f"`python -m export default --out {settings.artefact_root} --variant {variant}` "
            "or set TSERVE_AUTO_EXPORT=true"
        )
    # stale: exported before the reference check; only the default ones can be re-exported here
    if missing or (settings.auto_export and any(n in _EXPORTED_BY_DEFAULT for n in stale)):
        await run_export(settings.artefact_root, variant, settings.export_timeout_s)
    from service.engine.loader import (
        load_engine,
    )  # onnxruntime sessions: import only when serving real models

    engines: list[Engine] = []
    for task, name in wanted:
        directory = settings.model_dir(name, variant)
        log.info("loading %s (%s, %s) from %s", name, variant, provider, directory)
        engine = await asyncio.to_thread(
            load_engine,
            directory,
            provider=provider,
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
        )
        if engine.manifest.task != task:
            raise ArtefactError(
                f"{directory / MANIFEST_NAME}: a {engine.manifest.task} model, configured for {task}"
            )
        engines.append(engine)
    return engines


def _unchecked(directory: Path) -> bool:
    try:
        return read_manifest(directory).reference_check is None
    except ArtefactError:
        return False  # loading will say what is wrong with it


async def run_export(out: Path, variant: str, timeout_s: float) -> None:
    """``python -m export default`` (every default model) in a subprocess (torch stays out of
    this process)."""
    command = [sys.executable, "-m", "export", "default", "--out", str(out), "--variant", variant]
    log.info("artefacts missing: running %s", " ".join(command))
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    tail: list[str] = []

    async def relay() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            log.info("export: %s", line)
            tail[:] = [*tail[-(_TAIL_LINES - 1) :], line]

    try:
        async with asyncio.timeout(timeout_s):
            await relay()
            code = await process.wait()
    except (TimeoutError, asyncio.CancelledError) as e:
        process.kill()
        await process.wait()
        if isinstance(e, asyncio.CancelledError):
            raise
        raise ArtefactError(f"export did not finish within {timeout_s:g} s") from e
    if code != 0:
        missing = re.search(r"No module named '([\w.]+)'", "\n".join(tail))
        hint = (
            f" ({missing.group(1)} missing: install the export extra, pip install '.[export]')"
            if missing
            else ""
        )
        raise ArtefactError(f"export failed with exit code {code}{hint}:\n" + "\n".join(tail))
