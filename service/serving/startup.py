"""The service's start, outside HTTP: load the configured models from ``artefact_root``
(exporting the default ones first when they are missing or stale and the settings allow it:
``python -m export default`` in a subprocess, so that torch stays out of the service's process),
warm them up and hand them to the ``Runtime``, which gives each its queue and declares the
service ready.

The server listens at once and the models load in the background, so liveness probes pass during
a long first start while readiness gates traffic.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from service.artefacts import MANIFEST_NAME, ArtefactError, Variant, read_manifest, served_decoder_layout
from service.engine.base import Engine
from service.serving.runtime import Runtime
from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS, Settings

log = logging.getLogger(__name__)

GivenEngines = Mapping[str, Engine] | Sequence[Engine]

_TAIL_LINES = 20  # of the export's output, quoted when it fails
_EXPORTED_BY_DEFAULT = {*DEFAULT_TRANSLATE_MODELS, DEFAULT_EMBED_MODEL}  # `python -m export default`


async def load_engines(settings: Settings) -> list[Engine]:
    """``artefact_root/<model>/<variant>`` for each configured model, exported first if missing
    (one export subprocess for all of them; it knows only the default models)."""
    provider = settings.resolved_provider()
    variant = settings.resolved_variant(provider)
    wanted = [("translate", name) for name in settings.translation_models]
    if settings.embed_model:
        wanted.append(("embed", settings.embed_model))
    if settings.rerank_model:
        wanted.append(("rerank", settings.rerank_model))
    names = [n for _, n in wanted]
    if _needs_export(settings, names, variant):
        # With several serving processes each finds the artefacts missing: one exports while the
        # others wait for the lock, then find them there.
        lock = await asyncio.to_thread(_export_lock, settings.artefact_root)
        try:
            if _needs_export(settings, names, variant):
                await run_export(settings.artefact_root, variant, settings.export_timeout_s)
        finally:
            os.close(lock)
    # onnxruntime sessions: import only when serving real models
    from service.engine.loader import load_engine
    from service.engine.session import SessionConfig

    engines: list[Engine] = []
    for task, name in wanted:
        directory = settings.model_dir(name, variant)
        log.info("loading %s (%s, %s) from %s", name, variant, provider, directory)
        engine = await asyncio.to_thread(
            load_engine,
            directory,
            SessionConfig(provider, settings.session_threads(), settings.inter_op_threads),
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            shortlist=settings.translate_shortlist and task == "translate",
        )
        if engine.manifest.task != task:
            raise ArtefactError(
                f"{directory / MANIFEST_NAME}: a {engine.manifest.task} model, configured for {task}"
            )
        engines.append(engine)
    return engines


def _needs_export(settings: Settings, names: list[str], variant: Variant) -> bool:
    """Whether the default models must be exported first: some missing, or stale (exported before
    the reference check, with a decoder layout no longer served, or int8 weights of 8 bits, wrong
    on CPUs without VNNI; only the default ones can be re-exported here). Raises when a missing
    model cannot be exported."""
    missing = [n for n in names if not (settings.model_dir(n, variant) / MANIFEST_NAME).is_file()]
    stale = [n for n in names if n not in missing and is_stale(settings.model_dir(n, variant))]
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
    return bool(missing) or (settings.auto_export and any(n in _EXPORTED_BY_DEFAULT for n in stale))


def _export_lock(root: Path) -> int:
    """An exclusive lock on ``root``'s ``.export.lock``, taken by every process serving from it:
    the file's descriptor, whose closing releases it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".export.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def is_stale(directory: Path) -> bool:
    """An artefact that loads but should be exported again (see ``load_engines``)."""
    try:
        manifest = read_manifest(directory)
        return (
            manifest.reference_check is None
            or not served_decoder_layout(manifest)
            or not manifest.int8_weights_current
            or not manifest.embedding_graph_current
        )
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


async def start(runtime: Runtime, given: GivenEngines | None) -> None:
    """Load (or take), warm up, then attach queues; any failure is fatal and explained."""
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
    """The engines in order; a task key must match its engine, and one embedder and one
    reranker at most."""
    if isinstance(given, Mapping):
        for key, engine in given.items():
            if key != engine.manifest.task:
                raise ArtefactError(
                    f"engine {engine.manifest.name!r} given as {key!r} is a {engine.manifest.task}"
                )
        given = list(given.values())
    if sum(e.manifest.task == "embed" for e in given) > 1:
        raise ArtefactError("at most one embedding engine is served")
    if sum(e.manifest.task == "rerank" for e in given) > 1:
        raise ArtefactError("at most one rerank engine is served")
    return list(given)
