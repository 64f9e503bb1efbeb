"""Every knob of the service, read once from the environment (prefix ``TSERVE_``).

This is the only place that reads the environment: the rest of the service gets a ``Settings``
object, so tests build one directly and nothing depends on the process's environment.
Lists (``TSERVE_API_KEYS``, ``TSERVE_CORS_ORIGINS``, ``TSERVE_TRANSLATE_MODELS``) take either a
JSON list or a comma-separated string.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.artefacts import Variant
from service.memory import MAX_MMAP_THRESHOLD_KB

# Absolute ceilings: the request schemas declare them (OpenAPI shows them); settings may only
# lower them, and the routes check the configured values.
HARD_MAX_ITEMS = 2048
HARD_MAX_CHARS = 100_000
HARD_MAX_REQUEST_CHARS = 1_000_000

ProviderSetting = Literal["auto", "cuda", "cpu"]
VariantSetting = Literal["auto", "fp32", "int8", "fp16"]

# What `python -m export default` exports (export/__main__.py reads these) and the service serves
# unless told otherwise; the first translator answers requests that name no pair.
DEFAULT_TRANSLATE_MODELS = ("transformer-en-de", "transformer-de-en")
DEFAULT_EMBED_MODEL = "all-MiniLM-L6-v2"


class KeyQuota(BaseModel):
    """One API key's limits (None: unlimited), each a token bucket holding the limit and refilled
    over its period (service/serving/quotas.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1)
    characters_per_minute: int | None = Field(default=None, ge=1)
    characters_per_day: int | None = Field(default=None, ge=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TSERVE_", extra="ignore", validate_default=True)

    # Network
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    # Serving processes on that port, each with its own models and queues (service/http/workers.py);
    # their metrics meet in metrics_dir (unset: a fresh temporary directory, removed at exit).
    workers: int = Field(default=1, ge=1, le=64)
    metrics_dir: Path | None = None

    # Connections and headers (hostile clients): enforced by the HTTP server (service/http/limits.py)
    header_timeout_s: float = Field(default=10.0, gt=0)  # request line + headers must arrive → 408, closed
    body_timeout_s: float = Field(default=15.0, gt=0)  # the whole body, from the end of the headers → 408
    # How long an idle keep-alive connection is kept: longer than clients' and proxies' own idle
    # expiry (httpx 5 s, load balancers 60 s), so that they close it first (http_limits.py).
    keep_alive_timeout_s: int = Field(default=75, ge=1)
    max_connections: int = Field(default=0, ge=0)  # 0: RLIMIT_NOFILE − connection_fd_reserve
    connection_fd_reserve: int = Field(default=256, ge=16)  # descriptors kept for models, logs, probes
    max_request_line_bytes: int = Field(default=8192, ge=256, le=1 << 20)  # request target → 414
    max_header_bytes: int = Field(default=16384, ge=1024, le=1 << 20)  # all header lines → 431
    max_header_count: int = Field(default=100, ge=8, le=10_000)  # → 431

    # Models: <artefact_root>/<model name>/<variant>/manifest.json; an empty name disables that task.
    artefact_root: Path = Path(".artefacts")
    # Translation: TRANSLATE_MODELS lists every model served (requests are routed by language
    # pair or by name; the first is the default); TRANSLATE_MODEL is the one-model shorthand
    # ("" serves no translation). Neither set: DEFAULT_TRANSLATE_MODELS. Both set: refused.
    translate_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    translate_model: str | None = None
    # Decode each sentence over its vocabulary shortlist (CTranslate2's vmap): every translation
    # model served must then be exported with --vmap FILE; the CPU variants (fp32, int8) only.
    translate_shortlist: bool = False
    embed_model: str = DEFAULT_EMBED_MODEL
    # A cross-encoder exported with `python -m export SOURCE --name NAME` (never auto-exported),
    # served at /v1/rerank; unset or empty: no reranking.
    rerank_model: str | None = None
    variant: VariantSetting = "auto"  # auto: fp16 on CUDA, else cpu_variant
    cpu_variant: Literal["fp32", "int8"] = "int8"
    provider: ProviderSetting = "auto"  # auto: CUDA when onnxruntime has it, else CPU
    auto_export: bool = True  # run `python -m export default` in a subprocess when artefacts are missing
    export_timeout_s: float = Field(default=3600.0, gt=0)

    # Batching (per model)
    max_batch_size: int = Field(default=32, ge=1, le=1024)
    max_batch_tokens: int = Field(default=8192, ge=1)  # padded tokens: longest item × items
    max_wait_ms: float = Field(default=5.0, ge=0, le=1000)
    max_queue: int = Field(default=4096, ge=1)  # queued items (texts, sentences); beyond it → 429
    # One extra worker per model (express) for requests of at most this many tokens while its
    # worker threads are busy: a short request does not wait behind a long batch. 0: off.
    express_max_tokens: int = Field(default=64, ge=0)
    request_timeout_s: float = Field(default=30.0, gt=0)  # deadline from arrival to result → 504
    # Translation: "batch" decodes each batch to its end before the next starts; "continuous"
    # admits sentences into the running decode between any two decoder steps and answers each as
    # soon as it is done (service/queue/continuous.py; needs a decoder exported with per-row positions
    # or slots, on the CPU backend, else batch is used). Continuous is the default: a short
    # sentence no longer waits for a batch of long ones (docs/decisions.md, "Continuous decoding").
    translate_batching: Literal["continuous", "batch"] = "continuous"
    # Worst-case decoder cache + memory of a model's running sentences (each at its own length
    # limit): sentences wait for room beyond it; one that could never fit → 422. 1 GiB: two
    # translation models and the embedder stay within k8s/base's 4 GiB limit even at worst case.
    decode_memory_mb: int = Field(default=1024, ge=1)
    decode_admit_tokens: int = Field(default=2048, ge=1)  # source tokens encoded between two steps
    # Once every model is idle after requests, let go of the translators' spare cache buffers
    # and give freed memory back to the OS (glibc's malloc_trim; service/memory.py), checked
    # this often; 0: never (a translator then keeps its last decode's buffers while idle).
    memory_trim_interval_s: float = Field(default=2.0, ge=0)
    # glibc heaps shared by all the process's threads (mallopt M_ARENA_MAX, set at start-up):
    # fewer heaps hold less free memory at a peak (service/memory.py: limit_heaps); 0: glibc's
    # default (8 per core).
    malloc_heaps: int = Field(default=2, ge=0)
    # Blocks of at least this many KiB get a mapping of their own, returned when freed, instead
    # of glibc's threshold that rises to 32 MiB (service/memory.py: map_large_blocks); 0: glibc's.
    malloc_mmap_threshold_kb: int = Field(default=2048, ge=0, le=MAX_MMAP_THRESHOLD_KB)
    # Net new Python objects between two collections of the youngest generation once serving
    # (Python's default: 700; the heap at start-up is frozen; service/memory.py: FrozenHeap).
    gc_young_threshold: int = Field(default=10_000, ge=100)

    # Threads
    # onnxruntime threads per session; 0: the cores shared among the runs one model may have in
    # flight at once (``session_threads``)
    intra_op_threads: int = Field(default=0, ge=0)
    inter_op_threads: int = Field(default=1, ge=1)
    # Engine runs at once per model, each on its worker thread: a whole batch each, or a running
    # decode each under continuous decoding (with an equal share of the decode memory). Several
    # single-threaded runs, as a small model's kernels gain nothing from being split over threads
    # (docs/decisions.md, "Worker threads").
    worker_threads: int = Field(default=2, ge=1, le=64)

    # Request limits
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_items_per_request: int = Field(default=64, ge=1, le=HARD_MAX_ITEMS)
    max_chars_per_text: int = Field(default=50_000, ge=1, le=HARD_MAX_CHARS)
    # Translation takes documents: all texts of one request together, and the sentences they
    # make (each one queue item; at most max_queue of them fit in the queue at once).
    max_translate_chars_per_request: int = Field(default=50_000, ge=1, le=HARD_MAX_REQUEST_CHARS)
    max_sentences_per_request: int = Field(default=2048, ge=1)
    # The most decoding one translation request may ask for: sentences × beam_size × max_length
    # (output tokens). 2^20 takes a 50,000-character document at beam 4 and the default max_length.
    max_decode_cost_per_request: int = Field(default=1 << 20, ge=1)
    # File translation (service/files): an uploaded file's bytes (the request body is bounded by
    # max_body_bytes as well), and what an archive (.docx, .pptx, .odt, .odp, .epub) may hold,
    # checked from its directory before anything is unpacked: entries, the bytes they unpack
    # to, and one entry's uncompressed/compressed ratio (zip bombs).
    max_file_bytes: int = Field(default=1 << 20, ge=1)
    max_archive_entries: int = Field(default=1000, ge=1)
    max_archive_uncompressed_bytes: int = Field(default=64 << 20, ge=1)
    max_archive_ratio: float = Field(default=100.0, ge=1)
    # LibreTranslate's /translate_file answers a URL: the translated files wait for their download
    # in memory (read-only roots), each for this long, all of them within this many bytes.
    translated_file_ttl_s: float = Field(default=600.0, gt=0)
    translated_files_max_bytes: int = Field(default=64 << 20, ge=1)
    # DeepL's /v2/document translates in the background: at most this many documents queued or
    # translating at once (more: DeepL's 429); the finished ones are kept as the files above.
    max_documents_in_flight: int = Field(default=16, ge=1, le=10_000)

    # Access
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)  # empty: auth off
    # Each key's own limits (service/serving/quotas.py): JSON, or the path of a JSON file, mapping
    # keys of api_keys to KeyQuota fields; a key without an entry, or a limit left out, is unlimited.
    api_key_quotas: Annotated[dict[str, KeyQuota], NoDecode] = Field(default_factory=dict)

    # Glossaries (service/glossaries): one JSON file each under glossary_dir (created at the first
    # glossary; a writable volume where the root is read-only), shared by every process using it.
    # Bounds: a glossary's entries, a term's characters, and all glossaries together (their count
    # and the bytes of their files), whichever API key made them.
    glossary_dir: Path = Path(".glossaries")
    glossary_max_entries: int = Field(default=10_000, ge=1, le=1_000_000)
    glossary_max_term_chars: int = Field(default=200, ge=1, le=10_000)
    glossary_max_count: int = Field(default=1000, ge=1)
    glossary_max_total_bytes: int = Field(default=64 << 20, ge=1024)

    # Sentence translations kept for repeated sentences (service/serving/cache.py), in bytes of
    # their Python objects; 0: no cache.
    translation_cache_bytes: int = Field(default=64 << 20, ge=0)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)  # empty: CORS off

    # Playground
    playground: bool = True  # the browser page at / (its static files are exempt from auth, like /docs)

    # Lifecycle
    # After SIGTERM: answer 503 for drain_delay_s (load balancers notice), close the listener,
    # then give in-flight requests shutdown_grace_s to finish.
    drain_delay_s: float = Field(default=10.0, ge=0)  # = the readiness probe's period × failures
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @field_validator("api_keys", "cors_origins", "translate_models", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("api_key_quotas", mode="before")
    @classmethod
    def _quotas_from_json_or_file(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return {}
        return json.loads(text if text.startswith("{") else Path(text).read_text(encoding="utf-8"))

    @field_validator("api_keys")
    @classmethod
    def _no_blank_keys(cls, keys: list[str]) -> list[str]:
        if any(not key.strip() for key in keys):
            raise ValueError("API keys must not be blank")
        return keys

    @field_validator("translate_models")
    @classmethod
    def _distinct_models(cls, names: list[str]) -> list[str]:
        if any(not name.strip() for name in names):
            raise ValueError("model names must not be blank")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return names

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.translate_models and self.translate_model is not None:
            raise ValueError("set translate_models (several models) or translate_model (one), not both")
        if not self.translation_models and not self.embed_model and not self.rerank_model:
            raise ValueError("serve at least one model: set translate_models, embed_model or rerank_model")
        unknown = sorted(set(self.api_key_quotas) - set(self.api_keys))
        if unknown:  # a quota on a key that does not exist guards nothing: a typo, said at start
            raise ValueError(f"api_key_quotas: {len(unknown)} key(s) not among api_keys")
        if self.max_queue < self.max_items_per_request:
            raise ValueError(
                "max_queue must be at least max_items_per_request (else a full request never fits)"
            )
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @property
    def translation_models(self) -> list[str]:
        """The translation artefacts to serve, the default (first) one first."""
        if self.translate_models:
            return list(self.translate_models)
        if self.translate_model is not None:
            return [self.translate_model] if self.translate_model else []
        return list(DEFAULT_TRANSLATE_MODELS)

    def resolved_provider(self) -> Literal["cuda", "cpu"]:
        """``auto`` → CUDA when this onnxruntime build offers it (onnxruntime-gpu) and the driver
        sees a GPU, else CPU."""
        if self.provider != "auto":
            return self.provider
        from service.cuda import cuda_usable  # onnxruntime, imported late: settings load fast

        return "cuda" if cuda_usable() else "cpu"

    def resolved_variant(self, provider: Literal["cuda", "cpu"] | None = None) -> Variant:
        """``auto`` → fp16 on CUDA (tensor cores), else ``cpu_variant`` (int8 wants a VNNI CPU)."""
        if self.variant != "auto":
            return self.variant
        return "fp16" if (provider or self.resolved_provider()) == "cuda" else self.cpu_variant

    def session_threads(self) -> int:
        """onnxruntime intra-op threads per session: as set, or with 0 the usable cores divided
        among the engine runs one model may have in flight at once (its worker threads, and the
        express one) in every serving process, at least 1: concurrent runs that each spread over
        every core contend for the same cores (docs/decisions.md, "TSERVE_INTRA_OP_THREADS=0")."""
        if self.intra_op_threads:
            return self.intra_op_threads
        runs = self.worker_threads + (1 if self.express_max_tokens else 0)
        concurrent = runs * self.workers  # every serving process runs its own
        affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
        cores = len(affinity(0)) if affinity else os.cpu_count() or 1
        return max(1, cores // concurrent)

    def model_dir(self, model: str, variant: Variant) -> Path:
        return self.artefact_root / model / variant
