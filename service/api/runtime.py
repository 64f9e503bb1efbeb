"""What the routes share: the loaded models, their batchers, the lifecycle state, and the
dependencies that gate a request (API key, readiness, client disconnect).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.errors import ClientDisconnected, Forbidden, NotReady, ShuttingDown, Unauthorized
from service.api.schemas import RequestLimits
from service.batching import BatchPolicy, DynamicBatcher
from service.engine.base import EmbedEngine, EmbedItem, Engine, TranslateEngine, TranslateItem
from service.metrics import MODEL_INFO, READY
from service.scheduling import ContinuousBatcher, DecodeBudget
from service.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
State = Literal["loading", "ready", "draining", "failed"]


@dataclass
class Translator:
    engine: TranslateEngine
    batcher: DynamicBatcher[TranslateItem, Any]

    @property
    def name(self) -> str:
        return self.engine.manifest.name

    @property
    def sources(self) -> list[str]:
        info = self.engine.manifest.translation
        return info.source_languages if info else []

    @property
    def targets(self) -> list[str]:
        info = self.engine.manifest.translation
        return info.target_languages if info else []

    def pairs(self) -> list[str]:
        return [f"{s}→{t}" for s in self.sources for t in self.targets if s != t]

    def serves(self, source: str | None, target: str | None) -> bool:
        """Whether it translates ``source`` into ``target`` (None: any)."""
        return (source is None or source in self.sources) and (target is None or target in self.targets)


@dataclass
class Embedder:
    engine: EmbedEngine
    batcher: DynamicBatcher[EmbedItem, Any]


@dataclass
class Runtime:
    settings: Settings
    state: State = "loading"
    detail: str | None = None
    translators: dict[str, Translator] = field(default_factory=dict)  # by name, the default first
    embedder: Embedder | None = None
    on_fatal: Callable[[BaseException], None] | None = None  # the server's exit hook, when there is one
    limits: RequestLimits = field(init=False)

    def __post_init__(self) -> None:
        self.limits = RequestLimits.from_settings(self.settings)
        READY.set(0)

    @property
    def models(self) -> list[Translator | Embedder]:
        return [*self.translators.values(), *([self.embedder] if self.embedder else [])]

    @property
    def engines(self) -> list[Engine]:
        return [m.engine for m in self.models]

    @property
    def batchers(self) -> list[DynamicBatcher[Any, Any]]:
        return [m.batcher for m in self.models]

    @property
    def default_translator(self) -> Translator | None:
        return next(iter(self.translators.values()), None)

    def translators_for(self, source: str | None, target: str | None) -> list[Translator]:
        """The models translating ``source`` into ``target`` (None: any), in configured order."""
        return [t for t in self.translators.values() if t.serves(source, target)]

    def served_pairs(self) -> list[str]:
        """Every ``source→target`` served, once each, in configured order."""
        return list(dict.fromkeys(p for t in self.translators.values() for p in t.pairs()))

    def attach(self, engines: list[Engine]) -> None:
        """Start a batcher per warmed-up engine and declare the service ready (in the event loop)."""
        s = self.settings
        policy = BatchPolicy(
            max_batch_size=s.max_batch_size,
            max_batch_tokens=s.max_batch_tokens,
            max_wait_s=s.max_wait_ms / 1000,
            max_queue=s.max_queue,
            workers=s.worker_threads,
            express_max_tokens=s.express_max_tokens,
        )
        for engine in engines:
            name = engine.manifest.name
            if engine.manifest.task == "translate":
                translate: TranslateEngine = engine  # type: ignore[assignment]
                translator = self.translators[name] = Translator(
                    translate, self._translate_batcher(translate, policy)
                )
                translator.batcher.start()
            else:
                embed: EmbedEngine = engine  # type: ignore[assignment]
                self.embedder = Embedder(embed, DynamicBatcher(name, embed.embed, _embed_cost(embed), policy))
                self.embedder.batcher.start()
            MODEL_INFO.labels(
                model=name,
                task=engine.manifest.task,
                variant=engine.manifest.variant,
                provider=engine.provider,
            ).set(1)
        if self.state == "loading":
            self.state = "ready"
            READY.set(1)
            log.info("ready: %s", ", ".join(e.manifest.name for e in engines))

    def _translate_batcher(
        self, engine: TranslateEngine, policy: BatchPolicy
    ) -> DynamicBatcher[TranslateItem, Any]:
        """Iteration-level batching where the setting asks for it and the engine can admit
        sentences into a running decode; whole-batch decoding otherwise."""
        s = self.settings
        if s.translate_batching == "continuous" and getattr(engine, "joins_midway", False):
            budget = DecodeBudget(
                s.decode_memory_mb << 20, getattr(engine, "max_decode_rows", 512), s.decode_admit_tokens
            )
            return ContinuousBatcher(engine, _translate_cost(engine), policy, budget)  # type: ignore[arg-type]
        return DynamicBatcher(
            engine.manifest.name,
            engine.translate,
            _translate_cost(engine),
            policy,
            on_abandon=lambda item: item.abandoned.set(),
        )

    def fail(self, error: BaseException) -> None:
        self.state = "failed"
        self.detail = str(error)
        READY.set(0)
        log.error("cannot serve: %s", error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    def begin_drain(self) -> None:
        """Readiness → 503 and new model requests → 503 at once; queued work still completes."""
        if self.state in ("draining", "failed"):
            return
        self.state = "draining"
        READY.set(0)
        for batcher in self.batchers:
            batcher.stop_accepting()
        log.info("draining: refusing new requests, finishing in-flight ones")

    async def close(self, timeout_s: float) -> None:
        self.begin_drain()
        await asyncio.gather(*(b.drain(timeout_s) for b in self.batchers))
        await asyncio.gather(*(b.close() for b in self.batchers))


def _translate_cost(engine: TranslateEngine) -> Callable[[TranslateItem], int]:
    return lambda item: engine.count_tokens(item.text)


def _embed_cost(engine: EmbedEngine) -> Callable[[EmbedItem], int]:
    """Tokens the engine will actually compute: a truncated text costs at most the max length."""
    info = engine.manifest.embedding
    max_len = info.max_len if info is not None else None

    def cost(item: EmbedItem) -> int:
        n = engine.count_tokens(item.text)
        return min(n, max_len) if item.truncate and max_len else n

    return cost


# ---- dependencies ----------------------------------------------------------------------------


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def ready_runtime(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Runtime:
    """503 unless every model is loaded and warmed up and the service is not shutting down."""
    if runtime.state == "ready":
        return runtime
    if runtime.state == "draining":
        raise ShuttingDown("shutting down; retry on another replica", headers={"Connection": "close"})
    detail = f": {runtime.detail}" if runtime.detail else ""
    raise NotReady(f"not ready ({runtime.state}{detail})", headers={"Retry-After": "5"})


async def serving_runtime(runtime: Annotated[Runtime, Depends(get_runtime)]) -> Runtime:
    """``ready_runtime`` as a route dependency: async, as FastAPI runs a sync dependency on a
    worker thread (a thread hop per request)."""
    return ready_runtime(runtime)


_bearer = HTTPBearer(auto_error=False, description="One of TSERVE_API_KEYS (when set)")


async def require_api_key(
    runtime: Annotated[Runtime, Depends(get_runtime)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 without a bearer key, 403 with a wrong one; nothing to check when no keys are set."""
    keys = runtime.settings.api_keys
    if not keys:
        return
    if credentials is None:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"}
        )
    given = credentials.credentials.encode()
    # Compare against every key (no early exit), in constant time per key.
    matched = [secrets.compare_digest(given, key.encode()) for key in keys]
    if not any(matched):
        raise Forbidden("invalid API key")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it (its queued items are
    dropped by the batcher) and raise ``ClientDisconnected``. Starlette does not cancel a
    handler when its client leaves, so without this the work would be computed for nobody.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected()
