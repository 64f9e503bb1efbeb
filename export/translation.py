"""Export a translation checkpoint (ours or Marian) to verified ONNX artefacts, one per variant.

    export_translation(Path("export/checkpoints/transformer-en-de"), Path(".artefacts"),
                       ["fp32", "int8", "fp16"], eval_dir=Path("../shared/data/multi30k"))

writes ``<out_root>/<name>/<variant>/{encoder.onnx, decoder.onnx, tokenizer.json, manifest.json}``
in the layout of ``export.translation_graphs``. Nothing is trusted unverified: each variant is
staged, loaded with the service's own loader and decoded by the service's own engine
(``OnnxTranslator``, export/translation_checks.py), and its manifest is published only once:

* fp32: memory K/V, log-probs and alignments within ``FP32_TOLERANCE`` of PyTorch on real
  sentences (decoded step by step with the cache) and random padded batches of mixed lengths;
  and the engine's greedy tokens equal PyTorch's on the built-in sentences and on the first
  validation sentences when ``eval_dir`` has them.
* int8 (per-row, export/int8_rowwise.py) / fp16: the same figures are recorded (not bounded),
  and when ``eval_dir`` has the test set, sacreBLEU with beam 4 may drop at most
  ``MAX_BLEU_DROP`` below the fp32 graph's.
* every variant, with or without ``eval_dir``: the committed reference sentences
  (export/reference.py) translated alone and in mixed-length batches give identical tokens at
  beam 1 and 4, and int8/fp16's beam-4 output keeps a chrF bound against fp32's; the figures and
  bounds go into ``Manifest.reference_check``.

A variant whose manifest already names the same source weights and still verifies is skipped,
so re-running the export is cheap.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from export.determinism import TranslationDeterminism, translation_determinism
from export.onnx_tools import (
    VerificationError,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    quantize_int8,
    source_sha256,
)
from export.reference import REFERENCE_FILE, ReferenceSet, load_reference, translation_check
from export.sources import TranslationSource
from export.translation_checks import (
    BUILTIN_SENTENCES,
    EVAL_BEAM,
    TEST_SPLIT,
    BleuResult,
    check_greedy,
    default_limits,
    encode_sources,
    eval_bleu,
    greedy_agreement,
    open_engine,
    parity,
    validation_texts,
)
from export.translation_graphs import (
    DEFAULT_DECODER_LAYOUT,
    example_inputs,
    export_graphs,
    load_ours,
)
from service.artefacts import (
    ArtefactError,
    DecoderLayout,
    Manifest,
    ReferenceCheck,
    SourceInfo,
    TranslationInfo,
    decoder_layout_of,
    load_and_verify,
    read_manifest,
    sha256_of,
    write_manifest,
)
from service.engine.translator import OnnxTranslator

VARIANTS = ("fp32", "int8", "fp16")
FP32_TOLERANCE = 1e-4  # max |ONNX - PyTorch| on memory K/V, log-probs and alignments
MAX_BLEU_DROP = 0.5  # int8/fp16 vs fp32, sacreBLEU points on the test set


__all__ = ["VerificationError", "export_translation"]  # VerificationError: onnx_tools' shared one


def progress(message: str) -> None:
    print(f"[export] {message}", file=sys.stderr, flush=True)


# --- graphs: export, optimise, variants ------------------------------------------------------------


def optimize_graph(path: Path, source: TranslationSource) -> dict[str, int]:
    """onnxruntime's transformer optimiser with the encoder-decoder ("bart") fusions, in place and
    portable (opt_level 0). Returns what fused; {} when it does not apply (best effort: an unfused
    graph is still correct, and verification runs on whatever is written)."""
    try:
        return optimize(path, path, "bart", source.n_heads, source.n_heads * source.d_head, opt_level=0)
    except Exception as e:
        progress(f"  optimiser skipped for {path.name}: {e}")
        return {}


def _merge_fusions(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            merged[k] = merged.get(k, 0) + v
    return merged


def build_fp32(
    source: TranslationSource, out_dir: Path, layout: DecoderLayout = DEFAULT_DECODER_LAYOUT
) -> dict[str, int]:
    """Traced, then optimised fp32 graphs in ``out_dir``; returns the fusion counts."""
    encoder, decoder = source.build_graphs(torch.float32)
    export_raw(source, encoder, decoder, torch.float32, out_dir, layout)
    return _merge_fusions(*(optimize_graph(out_dir / f, source) for f in ("encoder.onnx", "decoder.onnx")))


def export_raw(
    source: TranslationSource,
    encoder: torch.nn.Module,
    decoder: torch.nn.Module,
    dtype: torch.dtype,
    out_dir: Path,
    layout: DecoderLayout = DEFAULT_DECODER_LAYOUT,
) -> None:
    src, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, dtype, source.special.pad
    )
    export_graphs(encoder, decoder, src, step, out_dir, layout)


def build_int8(fp32_dir: Path, out_dir: Path) -> dict[str, int]:
    """Per-row int8 graphs (export/int8_rowwise.py); returns the count of quantised MatMuls."""
    for name in ("encoder.onnx", "decoder.onnx"):
        quantize_int8(fp32_dir / name, out_dir / name)
    return _count_ops(out_dir, ("MatMulIntegerToFloat",))


def build_fp16(source: TranslationSource, out_dir: Path) -> dict[str, int]:
    """The model traced in float16: K/V and hidden states in float16; log_probs and alignments stay
    float32 (the wrappers cast before log-softmax), so scores keep full precision."""
    encoder, decoder = source.build_graphs(torch.float16)
    export_raw(source, encoder, decoder, torch.float16, out_dir)
    return _merge_fusions(*(optimize_graph(out_dir / f, source) for f in ("encoder.onnx", "decoder.onnx")))


def _count_ops(
    directory: Path, ops: Sequence[str], files: Sequence[str] = ("encoder.onnx", "decoder.onnx")
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in files:
        for node in onnx.load(str(directory / name), load_external_data=False).graph.node:
            if node.op_type in ops:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def cpu_fp16_casts(directory: Path, work: Path) -> float:
    """How many Cast nodes the CPU provider inserts into the fp16 graphs: around each op it has no
    float16 kernel for, which then runs in float32. CPU figures of an fp16 variant are therefore
    closer to fp32 than what a GPU computes; its BLEU and parity are verified only as far as that."""
    inserted = 0
    for name in ("encoder.onnx", "decoder.onnx"):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(work / f"cpu-{name}")
        ort.InferenceSession(str(directory / name), options, providers=["CPUExecutionProvider"])
        before = _count_ops(directory, ("Cast",), [name]).get("Cast", 0)
        inserted += _count_ops(work, ("Cast",), [f"cpu-{name}"]).get("Cast", 0) - before
    return float(inserted)


# --- manifest --------------------------------------------------------------------------------------


def build_manifest(
    source: TranslationSource,
    variant: str,
    directory: Path,
    sha: str,
    parity_figures: dict[str, float],
    fusions: dict[str, int],
    reference_check: ReferenceCheck | None = None,
) -> Manifest:
    opset, ir_version = opset_and_ir(directory / "decoder.onnx")
    files = file_entries(directory, ["encoder.onnx", "decoder.onnx", "tokenizer.json"])
    return Manifest(
        name=source.name,
        task="translate",
        variant=variant,  # type: ignore[arg-type]  # checked against VARIANTS
        source=SourceInfo(kind=source.kind, path=str(source.path), sha256=sha),
        files=files,
        graphs={
            "encoder": graph_spec(directory, "encoder.onnx"),
            "decoder": graph_spec(directory, "decoder.onnx"),
        },
        vocab_size=source.vocab_size,
        special_ids=source.special,
        translation=TranslationInfo(
            source_languages=source.source_languages,
            target_languages=source.target_languages,
            n_layers=source.n_layers,
            n_heads=source.n_heads,
            d_head=source.d_head,
            max_source_len=source.max_source_len,
            max_target_len=source.max_target_len,
            has_alignments=True,
            decoder_layout=decoder_layout(directory / "decoder.onnx"),
        ),
        opset=opset,
        ir_version=ir_version,
        onnxruntime_version=ort.__version__,
        parity={k: round(float(v), 8) for k, v in parity_figures.items()},
        fusions=fusions,
        reference_check=reference_check,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def decoder_layout(path: Path) -> DecoderLayout:
    """The layout the decoder graph at ``path`` has, read from its inputs."""
    names = {t.name for t in graph_spec(path).inputs}
    return decoder_layout_of(names)


def write_tokenizer(source: TranslationSource, directory: Path) -> None:
    if source.tokenizer_file is not None:
        shutil.copyfile(source.tokenizer_file, directory / "tokenizer.json")  # byte for byte
    else:
        source.tokenizer.save(str(directory / "tokenizer.json"))


def up_to_date(
    directory: Path, source: TranslationSource, sha: str, variant: str, reference_sha: str
) -> bool:
    """A verified artefact of the same weights (and tokenizer) and variant is already there,
    measured on the current reference sentences, with the current default decoder layout (an
    older layout still loads, but the re-export is faster)."""
    try:
        manifest = load_and_verify(directory)
    except ArtefactError:
        return False
    if manifest.source.sha256 != sha or manifest.variant != variant or manifest.task != "translate":
        return False
    if manifest.translation is None or manifest.translation.decoder_layout != DEFAULT_DECODER_LAYOUT:
        return False
    check = manifest.reference_check
    unverifiable = manifest.parity.get("cpu_verified") == 0.0  # fp16 the CPU provider cannot run
    if not unverifiable and (check is None or check.sha256 != reference_sha):
        return False
    if source.tokenizer_file is not None:
        listed = {f.path: f.sha256 for f in manifest.files}
        return listed.get("tokenizer.json") == sha256_of(source.tokenizer_file)
    return True


# --- the export ------------------------------------------------------------------------------------


def load_source(path: Path, name: str | None = None) -> TranslationSource:
    """A Marian directory (config.json with model_type marian) or a checkpoint of ours; the
    artefact name defaults to the checkpoint's directory name."""
    from export.sources.marian import is_marian_dir, load_marian

    return load_marian(path, name) if is_marian_dir(path) else load_ours(path, name)


class _Exporter:
    """One source's variants: shared fp32 graphs, PyTorch references, the fp32 baselines (BLEU and
    the reference-set outputs) that int8/fp16 are measured against."""

    def __init__(
        self,
        source: TranslationSource,
        sha: str,
        eval_dir: Path | None,
        work: Path,
        reference_set: ReferenceSet,
    ) -> None:
        self.source, self.sha, self.eval_dir, self.work = source, sha, eval_dir, work
        self.val_texts = validation_texts(source, eval_dir)
        self.reference_set = reference_set
        self._fp32: tuple[Path, dict[str, int]] | None = None
        self._reference: dict[str, list[list[int]]] = {}
        self._bleu_fp32: BleuResult | None = None
        self._fp32_determinism: TranslationDeterminism | None = None

    def texts(self, which: str) -> list[str]:
        return BUILTIN_SENTENCES if which == "builtin" else self.val_texts

    def reference_greedy(self, which: str) -> list[list[int]]:
        if which not in self._reference:
            ids = encode_sources(self.source, self.texts(which))
            progress(f"  PyTorch greedy reference on {len(ids)} {which} sentences")
            self._reference[which] = self.source.reference.greedy(
                ids, default_limits(ids, self.source.max_target_len)
            )
        return self._reference[which]

    def fp32_dir(self) -> tuple[Path, dict[str, int]]:
        """The fp32 graphs as an artefact directory (with a manifest, so the engine can load it)."""
        if self._fp32 is None:
            directory = self.work / "fp32"
            progress("  tracing the fp32 encoder/decoder graphs and optimising")
            fusions = build_fp32(self.source, directory)
            write_tokenizer(self.source, directory)
            write_manifest(directory, build_manifest(self.source, "fp32", directory, self.sha, {}, fusions))
            self._fp32 = directory, fusions
        return self._fp32

    def bleu_fp32(self) -> BleuResult | None:
        if self._bleu_fp32 is None and self.eval_dir is not None:
            progress(f"  sacreBLEU of fp32 on {TEST_SPLIT} (beam {EVAL_BEAM})")
            self._bleu_fp32 = eval_bleu(open_engine(self.fp32_dir()[0]), self.source, self.eval_dir)
        return self._bleu_fp32

    def fp32_determinism(self) -> TranslationDeterminism:
        if self._fp32_determinism is None:
            self._fp32_determinism = self.determinism("fp32", open_engine(self.fp32_dir()[0]))
        return self._fp32_determinism

    def determinism(self, variant: str, engine: OnnxTranslator) -> TranslationDeterminism:
        n = len(self.reference_set.sentences)
        progress(f"  {variant}: {n} reference sentences alone vs in mixed batches (beam 1 and 4)")
        return translation_determinism(engine, self.reference_set.sentences)

    def build(self, variant: str, directory: Path) -> dict[str, int]:
        """Graphs of ``variant`` and the tokenizer in ``directory``; returns the fusion counts."""
        if variant == "fp32":
            fp32, fusions = self.fp32_dir()
            for name in ("encoder.onnx", "decoder.onnx"):
                shutil.copyfile(fp32 / name, directory / name)
        elif variant == "int8":
            progress("  quantising to int8 (per-row activations)")
            fusions = _merge_fusions(self.fp32_dir()[1], build_int8(self.fp32_dir()[0], directory))
        else:
            progress("  tracing the fp16 graphs and optimising")
            fusions = build_fp16(self.source, directory)
        write_tokenizer(self.source, directory)
        return fusions

    def verify(self, variant: str, directory: Path) -> tuple[dict[str, float], ReferenceCheck | None]:
        """Load the staged directory as the service does and check it; (parity, reference check)."""
        self.check_tokenizer()
        try:
            engine = open_engine(directory)
        except Exception as e:  # fp16 kernels the CPU provider lacks: nothing more to verify here
            if variant != "fp16":
                raise
            progress(f"  fp16 graphs do not run on the CPU provider ({e}); recorded as unverified")
            return {"cpu_verified": 0.0}, None
        progress(f"  {variant}: parity against PyTorch fp32")
        figures = parity(engine, self.source, self.reference_greedy("builtin")).as_parity()
        if variant == "fp16":  # verified on CPU, where part of the graph runs in float32 (see below)
            figures |= {"cpu_verified": 1.0, "cpu_fp16_inserted_casts": cpu_fp16_casts(directory, self.work)}
        if variant == "fp32":
            figures |= self.verify_fp32(engine, figures)
        else:
            figures |= self.verify_reduced(variant, engine)
        determinism = self.determinism(variant, engine)  # the staged directory, as served
        if variant == "fp32":
            self._fp32_determinism = determinism
        baseline = None if variant == "fp32" else self.fp32_determinism()
        check, failures = translation_check(self.reference_set, determinism, baseline, variant != "fp16")
        progress(f"  {variant}: reference check {check.figures}")
        if failures:
            raise VerificationError(
                f"{self.source.name}/{variant} on the reference sentences: " + "; ".join(failures)
            )
        return figures, check

    def verify_fp32(self, engine: OnnxTranslator, figures: dict[str, float]) -> dict[str, float]:
        worst = max(figures.values())
        if worst > FP32_TOLERANCE:
            raise VerificationError(
                f"fp32 graphs differ from PyTorch by {worst:.3g} > {FP32_TOLERANCE}: {figures}"
            )
        out: dict[str, float] = {}
        for which in ("builtin", "val"):
            texts = self.texts(which)
            if not texts:
                continue
            progress(f"  fp32: engine greedy vs PyTorch greedy on {len(texts)} {which} sentences")
            check = check_greedy(engine, self.source, texts, self.reference_greedy(which))
            if check.mismatches:
                raise VerificationError(
                    f"fp32 ONNX greedy differs from PyTorch on {which} sentences {check.mismatches[:10]}"
                )
            out |= {
                f"greedy_{which}_sentences": check.sentences,
                f"greedy_{which}_near_ties": check.near_ties,
            }
        bleu = self.bleu_fp32()
        if bleu is not None:
            out |= {"bleu": bleu.bleu, "bleu_fp32": bleu.bleu, "bleu_drop": 0.0}
            progress(f"  fp32: BLEU {bleu.bleu:.2f}, {bleu.tokens_per_s:.0f} target tokens/s")
        return out

    def verify_reduced(self, variant: str, engine: OnnxTranslator) -> dict[str, float]:
        out = {}
        for which in ("builtin", "val"):
            if self.texts(which):
                out[f"greedy_{which}_agreement"] = greedy_agreement(
                    engine, self.source, self.texts(which), self.reference_greedy(which)
                )
        base = self.bleu_fp32()
        if base is None or self.eval_dir is None:
            return out
        progress(f"  sacreBLEU of {variant} on {TEST_SPLIT} (beam {EVAL_BEAM})")
        bleu = eval_bleu(engine, self.source, self.eval_dir)
        assert bleu is not None
        drop = base.bleu - bleu.bleu
        progress(
            f"  {variant}: BLEU {bleu.bleu:.2f} (fp32 {base.bleu:.2f}, drop {drop:.2f}), "
            f"{bleu.tokens_per_s:.0f} target tokens/s (fp32 {base.tokens_per_s:.0f})"
        )
        if drop > MAX_BLEU_DROP:
            raise VerificationError(f"{variant} loses {drop:.2f} BLEU against fp32 (limit {MAX_BLEU_DROP})")
        return out | {"bleu_fp32": base.bleu, "bleu": bleu.bleu, "bleu_drop": drop}

    def check_tokenizer(self) -> None:
        """A converted tokenizer must encode as the source framework's does."""
        if self.source.reference_encode is None:
            return
        want = self.source.reference_encode(BUILTIN_SENTENCES)
        got = [e.ids for e in self.source.tokenizer.encode_batch(BUILTIN_SENTENCES)]
        bad = [BUILTIN_SENTENCES[i] for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
        if bad:
            raise VerificationError(
                f"the converted tokenizer.json encodes differently from the source's: {bad[:3]}"
            )


def export_translation(
    source: Path,
    out_root: Path,
    variants: list[str],
    eval_dir: Path | None = None,
    name: str | None = None,
    reference: Path = REFERENCE_FILE,
) -> list[Path]:
    """Export ``source`` (a checkpoint of ours or a Marian directory) to
    ``<out_root>/<name>/<variant>/`` for each variant (``["all"]``: every one); returns those
    directories. ``name`` overrides the artefact name (default: the checkpoint directory's);
    ``reference`` is the sentence file every variant is measured on (export/reference.py).

    Each variant is built in a scratch directory next to its target and moved into place only
    once verified with its manifest, so a failed export leaves any previous artefact intact.
    """
    variants = list(VARIANTS) if variants == ["all"] else variants
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    progress(f"loading {source}")
    src = load_source(source, name)
    sha = source_sha256(src.weight_files)
    root = out_root / src.name
    targets = [root / v for v in variants]
    reference_set = load_reference(reference)
    todo = [v for v in variants if not up_to_date(root / v, src, sha, v, reference_set.sha256)]
    for v in variants:
        if v not in todo:
            progress(f"{src.name}/{v}: up to date (source sha256 {sha[:12]}…), skipped")
    if not todo:
        return targets
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="translation-export-") as work:
        exporter = _Exporter(src, sha, eval_dir, Path(work), reference_set)
        for variant in todo:
            _export_variant(exporter, variant, root)
    return targets


def _export_variant(exporter: _Exporter, variant: str, root: Path) -> None:
    start = time.perf_counter()
    source = exporter.source
    progress(f"{source.name}/{variant}: exporting")
    staging = root / f".{variant}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        fusions = exporter.build(variant, staging)
        # a provisional manifest (no figures yet) so that the service's loader can open the directory
        write_manifest(staging, build_manifest(source, variant, staging, exporter.sha, {}, fusions))
        parity_figures, check = exporter.verify(variant, staging)
        manifest = build_manifest(source, variant, staging, exporter.sha, parity_figures, fusions, check)
        write_manifest(staging, manifest)
        read_manifest(staging)  # round trip through the contract before publishing
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    target = root / variant
    old = root / f".{variant}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    progress(f"{source.name}/{variant}: done in {time.perf_counter() - start:.0f}s → {target}")
