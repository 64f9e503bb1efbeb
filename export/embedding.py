"""Export a BERT-family sentence-embedding model to verified ONNX artefacts (fp32, int8, fp16).

Source: a local Hugging Face model directory (config.json, weights, tokenizer.json), with
sentence-transformers' modules.json / 1_Pooling/config.json when it is a sentence-transformers
pipeline (pooling mode, Normalize module, max_seq_length are read from there; a plain HF
model gets mean pooling, no normalisation, like sentence-transformers gives it).

Each variant lands in ``<out_root>/<name>/<variant>/``: ``encoder.onnx`` (inputs ``input_ids``,
``attention_mask`` [, ``token_type_ids``], int64 [batch, seq]; output ``last_hidden_state``
float32 [batch, seq, dim]), ``tokenizer.json`` (truncation at ``max_len``, padding off: the
service pads its own batches) and ``manifest.json``. The graph is built and verified in a
staging directory and moved into place only once every check passed, so an out-of-tolerance
export raises :class:`VerificationError` and leaves no manifest behind (an earlier, verified
artefact at the same place is kept).

Verification (export/embedding_checks.py) loads each staged variant with the service's own
loader and embeds through ``OnnxEmbedder``, against sentence-transformers and PyTorch; every
variant also carries the reference-set figures (alone vs batched, int8/fp16 vs fp32) in
``Manifest.reference_check``.

Graphs: fp32 is the plain torch export (onnxruntime's CPU kernels run it faster than the
offline-fused graph, see export/onnx_tools.py), int8 its per-row rewrite; fp16 is built from the fused graph,
whose fusion counts its manifest records.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from export.embedding_checks import DEFAULT_TOLERANCES, Tolerances, Verifier, read_sts
from export.onnx_tools import (
    OPSET,
    export_onnx,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    quantize_int8,
    source_sha256,
    to_fp16,
)
from export.reference import REFERENCE_FILE, load_reference
from service.artefacts import (
    MANIFEST_NAME,
    ArtefactError,
    EmbeddingInfo,
    Manifest,
    ReferenceCheck,
    SourceInfo,
    SpecialIds,
    Variant,
    load_and_verify,
    write_manifest,
)

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
VARIANTS: tuple[Variant, ...] = ("fp32", "int8", "fp16")
GRAPH_FILE = "encoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
OUTPUT_NAME = "last_hidden_state"


@dataclass(frozen=True)
class EmbeddingSource:
    """What the export needs to know about a source directory, read from its JSON files only."""

    directory: Path
    model_type: str
    dim: int
    num_heads: int
    vocab_size: int
    pooling: Literal["mean", "cls"]
    normalize: bool
    max_len: int
    needs_token_type_ids: bool
    weight_files: tuple[Path, ...]

    def info(self) -> EmbeddingInfo:
        return EmbeddingInfo(
            dim=self.dim,
            pooling=self.pooling,
            normalize=self.normalize,
            max_len=self.max_len,
            needs_token_type_ids=self.needs_token_type_ids,
        )

    @property
    def input_names(self) -> list[str]:
        names = ["input_ids", "attention_mask"]
        return [*names, "token_type_ids"] if self.needs_token_type_ids else names


def _log(name: str, message: str) -> None:
    print(f"[export {name}] {message}", flush=True)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------
# reading the source


def _pipeline_modules(directory: Path) -> tuple[Literal["mean", "cls"], bool]:
    """(pooling, normalize) from sentence-transformers' modules.json; a plain HF dir → mean, no."""
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return "mean", False
    modules = _read_json(modules_path)
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = [t for t in types if t not in ("Transformer", "Pooling", "Normalize")]
    if unsupported:
        raise ValueError(f"{modules_path}: modules {unsupported} are not supported (only Pooling/Normalize)")
    pooling: Literal["mean", "cls"] = "mean"
    for module in modules:
        if str(module.get("type", "")).endswith("Pooling"):
            pooling = _pooling_mode(directory / module.get("path", "1_Pooling") / "config.json")
    return pooling, "Normalize" in types


def _pooling_mode(config_path: Path) -> Literal["mean", "cls"]:
    config = _read_json(config_path) if config_path.is_file() else {"pooling_mode_mean_tokens": True}
    if "pooling_mode" in config:  # newer sentence-transformers write the mode by name
        config = {f"pooling_mode_{config['pooling_mode']}_tokens": True}
    enabled = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v is True)
    if enabled == ["pooling_mode_mean_tokens"]:
        return "mean"
    if enabled in (["pooling_mode_cls_token"], ["pooling_mode_cls_tokens"]):
        return "cls"
    raise ValueError(f"{config_path}: pooling {enabled} is not supported (mean or cls only)")


def _max_len(directory: Path, config: dict[str, Any]) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's, capped by the positions."""
    candidates: list[int] = []
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file() and _read_json(st_config).get("max_seq_length"):
        candidates.append(int(_read_json(st_config)["max_seq_length"]))
    tok_config = directory / "tokenizer_config.json"
    if not candidates and tok_config.is_file():
        length = _read_json(tok_config).get("model_max_length")
        if isinstance(length, int | float) and 0 < length < 1_000_000:
            candidates.append(int(length))
    positions = config.get("max_position_embeddings")
    if positions:  # roberta-style positions start after the padding index
        roberta_like = config["model_type"] in ("roberta", "xlm-roberta")
        offset = int(config.get("pad_token_id") or 0) + 1 if roberta_like else 0
        candidates.append(int(positions) - offset)
    if not candidates:
        raise ValueError(f"{directory}: cannot tell the maximum sequence length")
    return min(candidates)


def _weight_files(directory: Path) -> tuple[Path, ...]:
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        found = sorted(directory.glob(pattern))
        if found:
            return tuple(found)
    raise ValueError(f"{directory}: no weight file (*.safetensors or pytorch_model.bin)")


def inspect_source(directory: Path) -> EmbeddingSource:
    """Read the source's config without loading torch; raise ValueError for what we cannot export."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory}: no config.json (not a Hugging Face model directory)")
    config = _read_json(config_path)
    model_type = str(config.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{directory}: model_type {model_type!r} is not supported for embeddings "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    pooling, normalize = _pipeline_modules(directory)
    return EmbeddingSource(
        directory=directory,
        model_type=model_type,
        dim=int(config.get("hidden_size") or config["dim"]),
        num_heads=int(config.get("num_attention_heads") or config.get("n_heads") or 0),
        vocab_size=int(config["vocab_size"]),
        pooling=pooling,
        normalize=normalize,
        max_len=_max_len(directory, config),
        # a single segment type needs no input: the model's own zeros are the same thing
        needs_token_type_ids=model_type == "bert" and int(config.get("type_vocab_size", 0)) > 1,
        weight_files=_weight_files(directory),
    )


def served_tokenizer(directory: Path, max_len: int) -> Tokenizer:
    """The source's fast tokenizer with truncation at ``max_len`` and padding off.

    sentence-transformers truncates at max_seq_length whatever tokenizer.json says (MiniLM's
    file says 128 and pads to 128); the served copy must do what the pipeline does.
    """
    from tokenizers import Tokenizer

    path = directory / TOKENIZER_FILE
    if path.is_file():
        tokenizer = Tokenizer.from_file(str(path))
    else:  # a slow-tokenizer-only source: let transformers convert it
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory)).backend_tokenizer
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_len)
    return tokenizer


def _special_ids(tokenizer: Tokenizer, directory: Path) -> SpecialIds:
    config = _read_json(directory / "config.json")
    pad = config.get("pad_token_id")
    if pad is None:
        found = [tokenizer.token_to_id(t) for t in ("[PAD]", "<pad>")]
        pad = next((i for i in found if i is not None), 0)
    unk_token = getattr(tokenizer.model, "unk_token", None)
    unk = tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None
    return SpecialIds(pad=int(pad), unk=unk)


def _export_plain_graph(source: EmbeddingSource, path: Path) -> None:
    """torch → ONNX with eager attention (the pattern onnxruntime's optimizer fuses)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(source.directory), attn_implementation="eager").float().eval()
    names = source.input_names

    class HiddenStates(torch.nn.Module):
        """Only last_hidden_state: pooling happens in the service (NumPy), not in the graph."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, inputs, strict=True))).last_hidden_state

    # a padded example so that the traced mask path is the general one
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, OUTPUT_NAME]}
    export_onnx(
        HiddenStates(),
        example,
        path,
        input_names=names,
        output_names=[OUTPUT_NAME],
        dynamic_axes=axes,
        opset=OPSET,
    )


# --------------------------------------------------------------------------------------------
# artefact directories


def _normalise_variants(variants: Iterable[str]) -> list[Variant]:
    wanted: set[str] = set()
    for v in variants:
        if v == "all":
            wanted.update(VARIANTS)
        elif v in VARIANTS:
            wanted.add(v)
        else:
            raise ValueError(f"unknown variant {v!r} (expected one of {', '.join(VARIANTS)} or all)")
    return [v for v in VARIANTS if v in wanted]


def _up_to_date(
    target: Path,
    name: str,
    variant: Variant,
    sha: str,
    info: EmbeddingInfo,
    want_sts: bool,
    reference_sha: str,
) -> bool:
    """True when ``target`` already holds this very export, intact (every sha256 checked) and
    measured on the current reference sentences."""
    if not (target / MANIFEST_NAME).is_file():
        return False
    try:
        manifest = load_and_verify(target)
    except ArtefactError:
        return False
    return (
        manifest.task == "embed"
        and manifest.name == name
        and manifest.variant == variant
        and manifest.source.sha256 == sha
        and manifest.embedding == info
        and (not want_sts or "sts_spearman" in manifest.parity)  # the asked-for check was run
        and manifest.reference_check is not None
        and manifest.reference_check.sha256 == reference_sha
    )


def _publish(staging: Path, target: Path) -> None:
    """Swap the verified staging directory into place; the old directory goes only afterwards."""
    old: Path | None = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class _Job:
    source: EmbeddingSource
    name: str
    sha: str
    special: SpecialIds


def _manifest(
    job: _Job,
    variant: Variant,
    staging: Path,
    fusions: dict[str, int],
    parity: dict[str, float],
    check: ReferenceCheck | None,
) -> Manifest:
    opset, ir_version = opset_and_ir(staging / GRAPH_FILE)
    return Manifest(
        name=job.name,
        task="embed",
        variant=variant,
        source=SourceInfo(kind="bert", path=str(job.source.directory), sha256=job.sha),
        files=file_entries(staging),
        graphs={"encoder": graph_spec(staging, GRAPH_FILE)},
        tokenizer=TOKENIZER_FILE,
        vocab_size=job.source.vocab_size,
        special_ids=job.special,
        embedding=job.source.info(),
        opset=opset,
        ir_version=ir_version,
        onnxruntime_version=_ort_version(),
        parity=parity,
        fusions=fusions,
        reference_check=check,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _write_variant(
    job: _Job,
    variant: Variant,
    graph: Path,
    tokenizer: Tokenizer,
    verifier: Verifier,
    fusions: dict[str, int],
    target: Path,
    publish: bool = True,
) -> Path:
    """Stage ``graph`` as an artefact, verify it through the service's loader and engine, and
    publish it at ``target`` (only verified, when ``publish`` is False: fp32 as the baseline)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{variant}.staging-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the published artefact from other users
    try:
        shutil.copyfile(graph, staging / GRAPH_FILE)
        tokenizer.save(str(staging / TOKENIZER_FILE))
        # a provisional manifest (no figures yet) so that the service's loader can open the directory
        write_manifest(staging, _manifest(job, variant, staging, fusions, {}, None))
        parity, check = verifier.measure(variant, staging)
        if not publish:
            shutil.rmtree(staging, ignore_errors=True)
            return target
        write_manifest(staging, _manifest(job, variant, staging, fusions, parity, check))
        load_and_verify(staging)  # the round trip the service will do
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _log(job.name, f"{variant}: wrote {target}")
    return target


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def export_embedding(
    source_dir: Path,
    out_root: Path,
    variants: list[str],
    sts_csv: Path | None = None,
    *,
    name: str | None = None,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
    threads: int | None = None,
    reference: Path = REFERENCE_FILE,
) -> list[Path]:
    """Export, verify and publish ``variants`` of an embedding model; return the artefact dirs.

    ``name`` defaults to the source directory's name; ``threads`` (default: torch's current
    setting) sizes the onnxruntime sessions used for verification; ``reference`` is the sentence
    file every variant is measured on (export/reference.py). Variants already up to date (same
    source hash, intact files, same reference file) are skipped. Raises VerificationError when a
    variant is out of tolerance (nothing published for it), ValueError for a source it cannot
    export.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only: never reach a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    source_dir, out_root = Path(source_dir), Path(out_root)
    source = inspect_source(source_dir)
    name = name or source_dir.resolve().name
    wanted = _normalise_variants(variants)
    sha = source_sha256(source.weight_files)
    targets = {v: out_root / name / v for v in wanted}
    want_sts = sts_csv is not None
    reference_set = load_reference(reference)
    todo = [
        v
        for v in wanted
        if not _up_to_date(targets[v], name, v, sha, source.info(), want_sts, reference_set.sha256)
    ]
    for v in wanted:
        if v not in todo:
            _log(name, f"{v}: up to date ({targets[v]})")
    if not todo:
        return [targets[v] for v in wanted]

    import torch

    (out_root / name).mkdir(parents=True, exist_ok=True)
    tokenizer = served_tokenizer(source_dir, source.max_len)
    job = _Job(source, name, sha, _special_ids(tokenizer, source_dir))
    verifier = Verifier(
        source,
        tokenizer,
        job.special.pad,
        read_sts(sts_csv) if sts_csv else None,
        reference_set,
        tolerances,
        threads or torch.get_num_threads(),
        name,
    )
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_root / name))
    try:
        return _export_variants(job, todo, wanted, targets, tokenizer, verifier, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _export_variants(
    job: _Job,
    todo: list[Variant],
    wanted: list[Variant],
    targets: dict[Variant, Path],
    tokenizer: Tokenizer,
    verifier: Verifier,
    work: Path,
) -> list[Path]:
    name, source = job.name, job.source
    plain = work / "plain.onnx"
    _log(name, f"exporting {source.model_type} (dim {source.dim}, {source.pooling} pooling) to ONNX")
    _export_plain_graph(source, plain)
    # fp32 is the reference of the other variants: always verified, published only if asked for
    fp32_target = targets.get("fp32", work / "fp32")  # staged next to its target, or in work/
    _write_variant(job, "fp32", plain, tokenizer, verifier, {}, fp32_target, publish="fp32" in todo)
    if "int8" in todo:
        _log(name, "quantizing to int8 (per-row activations, per-column QInt8 weights)")
        quantize_int8(plain, work / "int8.onnx")
        _write_variant(job, "int8", work / "int8.onnx", tokenizer, verifier, {}, targets["int8"])
    if "fp16" in todo:
        _log(name, "fusing (onnxruntime transformer optimizer) and converting to fp16")
        fusions = optimize(plain, work / "fused.onnx", "bert", source.num_heads, source.dim)
        _log(name, f"fusions: {fusions}")
        to_fp16(work / "fused.onnx", work / "fp16.onnx")
        _write_variant(job, "fp16", work / "fp16.onnx", tokenizer, verifier, fusions, targets["fp16"])
    return [targets[v] for v in wanted]
