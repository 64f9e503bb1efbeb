"""The served models and their state: each loaded engine with its request queue, the service's
readiness, its drain and close. ``service/serving/startup.py`` loads the engines and attaches
them here; the serving layer (``service/serving/``) serves requests with the ``Runtime``'s models.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

from service.cuda import CUDA
from service.engine.base import (
    EmbedEngine,
    EmbedItem,
    Engine,
    KeepsSpareMemory,
    TranslateEngine,
    TranslateItem,
)
from service.engine.reranker import RerankEngine, RerankItem
from service.engine.translation.running import ContinuousEngine
from service.languages import ModelLanguages, canonical
from service.memory import FrozenHeap, trim_when_idle
from service.metrics import MODEL_INFO, READY
from service.queue import (
    BatchPolicy,
    ContinuousExecutor,
    DecodeBudget,
    Executor,
    RequestQueue,
    WholeBatchExecutor,
)
from service.serving.cache import TranslationCache
from service.serving.limits import RequestLimits
from service.serving.quotas import QuotaBook
from service.settings import Settings

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "draining", "failed"]


class Peers(Protocol):
    """The host's serving processes when there are several (``service/http/workers.py``): this
    process tells them whether it is ready, and the host is ready only when every one is."""

    def mark(self, ready: bool) -> None: ...

    def not_ready(self) -> int:
        """How many of the host's processes are not ready, this one included."""
        ...


@dataclass
class TranslationModel:
    engine: TranslateEngine
    queue: RequestQueue[TranslateItem, Any]

    @property
    def name(self) -> str:
        return self.engine.manifest.name

    @functools.cached_property
    def languages(self) -> ModelLanguages:
        """Its languages as users name them (``service/languages.py``)."""
        return ModelLanguages.of(self.engine.manifest.translation)

    @property
    def sources(self) -> list[str]:
        return self.languages.sources

    @property
    def targets(self) -> list[str]:
        return self.languages.targets

    @property
    def length_penalty(self) -> float:
        """The default of requests that name none (the model's, tuned on its validation set)."""
        info = self.engine.manifest.translation
        return info.length_penalty if info else 1.0

    def pairs(self) -> list[str]:
        return self.languages.pairs()

    def serves(self, source: str | None, target: str | None) -> bool:
        """Whether it translates ``source`` into ``target`` (None: any; any code of a language)."""
        return (source is None or canonical(source) in self.sources) and (
            target is None or canonical(target) in self.targets
        )


@dataclass
class EmbeddingModel:
    engine: EmbedEngine
    queue: RequestQueue[EmbedItem, Any]


@dataclass
class RerankModel:
    engine: RerankEngine
    queue: RequestQueue[RerankItem, Any]


@dataclass
class Runtime:
    settings: Settings
    state: State = "loading"
    detail: str | None = None
    translation_models: dict[str, TranslationModel] = field(
        default_factory=dict
    )  # by name, the default first
    embedding_model: EmbeddingModel | None = None
    rerank_model: RerankModel | None = None
    on_fatal: Callable[[BaseException], None] | None = None  # the server's exit hook, when there is one
    peers: Peers | None = None  # set before the server starts, when it is one of several
    limits: RequestLimits = field(init=False)
    translation_cache: TranslationCache = field(init=False)
    quotas: QuotaBook = field(init=False)
    _trimmer: asyncio.Task[None] | None = field(default=None, init=False)
    _heap: FrozenHeap = field(init=False)

    def __post_init__(self) -> None:
        self._heap = FrozenHeap(self.settings.gc_young_threshold)
        self.limits = RequestLimits.from_settings(self.settings)
        self.translation_cache = TranslationCache(self.settings.translation_cache_bytes)
        self.quotas = QuotaBook(self.settings.api_key_quotas)
        READY.set(0)

    @property
    def models(self) -> list[TranslationModel | EmbeddingModel | RerankModel]:
        others = [m for m in (self.embedding_model, self.rerank_model) if m is not None]
        return [*self.translation_models.values(), *others]

    @property
    def engines(self) -> list[Engine]:
        return [m.engine for m in self.models]

    @property
    def queues(self) -> list[RequestQueue[Any, Any]]:
        return [m.queue for m in self.models]

    def release_spare_memory(self) -> None:
        """The engines let go of what they keep for their next calls (the service is idle)."""
        for engine in self.engines:
            if isinstance(engine, KeepsSpareMemory):
                engine.release_spare_memory()

    @property
    def default_translation_model(self) -> TranslationModel | None:
        return next(iter(self.translation_models.values()), None)

    def translation_models_for(self, source: str | None, target: str | None) -> list[TranslationModel]:
        """The models translating ``source`` into ``target`` (None: any), in configured order."""
        return [t for t in self.translation_models.values() if t.serves(source, target)]

    def served_pairs(self) -> list[str]:
        """Every ``source→target`` served, once each, in configured order; a multilingual
        model's as one entry naming its languages (``ModelLanguages.describe``)."""
        described = (
            [t.languages.describe()] if t.languages.multilingual else t.pairs()
            for t in self.translation_models.values()
        )
        return list(dict.fromkeys(p for entries in described for p in entries))

    def attach(self, engines: list[Engine]) -> None:
        """Start a queue per warmed-up engine and declare the service ready (in the event loop)."""
        s = self.settings
        policy = BatchPolicy(
            max_batch_size=s.max_batch_size,
            max_batch_tokens=s.max_batch_tokens,
            max_wait_s=s.max_wait_ms / 1000,
            max_queue=s.max_queue,
            worker_threads=s.worker_threads,
            express_max_tokens=s.express_max_tokens,
        )
        for engine in engines:
            name = engine.manifest.name
            if engine.manifest.task == "translate":
                translate: TranslateEngine = engine  # type: ignore[assignment]
                served = self.translation_models[name] = TranslationModel(
                    translate, self._translate_queue(translate, policy)
                )
                served.queue.start()
            elif engine.manifest.task == "rerank":
                rerank: RerankEngine = engine  # type: ignore[assignment]
                self.rerank_model = RerankModel(
                    rerank,
                    RequestQueue(
                        name,
                        _rerank_cost(rerank),
                        _encoder_policy(rerank, policy),
                        WholeBatchExecutor(rerank.rerank),
                    ),
                )
                self.rerank_model.queue.start()
            else:
                embed: EmbedEngine = engine  # type: ignore[assignment]
                self.embedding_model = EmbeddingModel(
                    embed,
                    RequestQueue(
                        name,
                        _embed_cost(embed),
                        _encoder_policy(embed, policy),
                        WholeBatchExecutor(embed.embed),
                    ),
                )
                self.embedding_model.queue.start()
            MODEL_INFO.labels(
                model=name,
                task=engine.manifest.task,
                variant=engine.manifest.variant,
                provider=engine.provider,
            ).set(1)
        if s.memory_trim_interval_s and self._trimmer is None:
            self._trimmer = asyncio.get_running_loop().create_task(
                trim_when_idle(lambda: self.queues, s.memory_trim_interval_s, self.release_spare_memory),
                name="memory-trim",
            )
        self._heap.freeze()
        if self.state == "loading":
            self._become("ready")
            log.info("ready: %s", ", ".join(e.manifest.name for e in engines))

    def _translate_queue(
        self, engine: TranslateEngine, policy: BatchPolicy
    ) -> RequestQueue[TranslateItem, Any]:
        """Iteration-level batching where the setting asks for it and the engine can admit
        sentences into a running decode; whole-batch decoding otherwise."""
        s = self.settings
        executor: Executor[TranslateItem, Any]
        if s.translate_batching == "continuous" and getattr(engine, "joins_midway", False):
            continuous = cast(ContinuousEngine, engine)
            budget = DecodeBudget(s.decode_memory_mb << 20, continuous.max_decode_rows, s.decode_admit_tokens)
            executor = ContinuousExecutor(continuous, budget)
        else:
            executor = WholeBatchExecutor(engine.translate, on_abandon=lambda item: item.abandoned.set())
        return RequestQueue(engine.manifest.name, _translate_cost(engine), policy, executor)

    def fail(self, error: BaseException) -> None:
        self.detail = str(error)
        self._become("failed")
        log.error("cannot serve: %s", error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    def begin_drain(self) -> None:
        """Readiness → 503 and new model requests → 503 at once; queued work still completes."""
        if self.state in ("draining", "failed"):
            return
        self._become("draining")
        for queue in self.queues:
            queue.stop_accepting()
        log.info("draining: refusing new requests, finishing in-flight ones")

    def _become(self, state: State) -> None:
        self.state = state
        READY.set(state == "ready")
        if self.peers is not None:
            self.peers.mark(state == "ready")

    def readiness(self) -> tuple[State, str | None]:
        """What ``/health/ready`` says: this process's state and detail, except that a ready
        process whose host has others not ready yet says loading."""
        waiting = self.peers.not_ready() if self.peers is not None and self.state == "ready" else 0
        if waiting:
            return "loading", f"{waiting} of {self.settings.workers} serving processes not ready"
        return self.state, self.detail

    async def close(self, timeout_s: float) -> None:
        self.begin_drain()
        await asyncio.gather(*(b.drain(timeout_s) for b in self.queues))
        if self._trimmer is not None:
            self._trimmer.cancel()
            await asyncio.gather(self._trimmer, return_exceptions=True)
        await asyncio.gather(*(b.close() for b in self.queues))
        self._heap.thaw()


def _translate_cost(engine: TranslateEngine) -> Callable[[TranslateItem], int]:
    return lambda item: engine.count_tokens(item.text)


def _encoder_policy(engine: Engine, policy: BatchPolicy) -> BatchPolicy:
    """An encoder-only model's batch limits: on CUDA only the token budget bounds a batch (a GPU
    computes many short rows as fast as a few; the engine's sub-batches do the same), elsewhere
    its sentences too."""
    if engine.provider != CUDA:
        return policy
    return replace(policy, max_batch_size=max(policy.max_batch_size, policy.max_batch_tokens))


def _embed_cost(engine: EmbedEngine) -> Callable[[EmbedItem], int]:
    """Tokens the engine will actually compute: a truncated text costs at most the max length."""
    info = engine.manifest.embedding
    max_len = info.max_len if info is not None else None

    def cost(item: EmbedItem) -> int:
        n = engine.count_tokens(item.text)
        return min(n, max_len) if item.truncate and max_len else n

    return cost


def _rerank_cost(engine: RerankEngine) -> Callable[[RerankItem], int]:
    """As ``_embed_cost``, for a query-document pair."""
    info = engine.manifest.rerank
    max_len = info.max_len if info is not None else None

    def cost(item: RerankItem) -> int:
        n = (item.encoded or engine.encode_pairs(item.query, [item.document])[0]).n_tokens
        return min(n, max_len) if item.truncate and max_len else n

    return cost
