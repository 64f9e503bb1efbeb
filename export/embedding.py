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

Verification runs the *served* path (the saved tokenizer copy, onnxruntime on CPU, the
service's NumPy pooling) against the source frameworks:

* fp32 hidden states vs PyTorch, max-abs over real (unpadded) positions ≤ 1e-4, on real
  sentences and on random mixed-length padded batches; pad positions are don't-care (the
  pooling never reads them, and fused attention kernels fill them differently);
* pooled embeddings vs ``SentenceTransformer(dir).encode``: min cosine ≥ 0.9999 (fp32);
* int8/fp16: mean cosine to fp32 ≥ 0.99;
* with an STS csv: Spearman (×100, "points") of fp32 within 0.05 points of
  sentence-transformers', int8/fp16 at most 0.5 points below fp32.

Graphs: fp32 and int8 are the plain torch export (onnxruntime's CPU kernels run it faster
than the offline-fused graph, see export/onnx_tools.py); fp16 is built from the fused graph,
whose fusion counts its manifest records.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from export.onnx_tools import (
    OPSET,
    VerificationError,
    cpu_session,
    export_onnx,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    quantize_int8,
    source_sha256,
    to_fp16,
)
from service.artefacts import (
    MANIFEST_NAME,
    ArtefactError,
    EmbeddingInfo,
    Manifest,
    SourceInfo,
    SpecialIds,
    Variant,
    load_and_verify,
    write_manifest,
)
from service.engine.pooling import l2_normalize, pool

if TYPE_CHECKING:
    import onnxruntime
    import torch
    from tokenizers import Encoding, Tokenizer

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
VARIANTS: tuple[Variant, ...] = ("fp32", "int8", "fp16")
GRAPH_FILE = "encoder.onnx"
TOKENIZER_FILE = "tokenizer.json"
OUTPUT_NAME = "last_hidden_state"

# Real sentences for the parity checks: varied length, punctuation, casing, digits, accents,
# an empty string and one text far beyond any max_seq_length (checks truncation matches).
CHECK_SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "Two dogs are running through a snowy field, chasing a red ball.",
    "",
    "Hi",
    "Quantum entanglement doesn't allow faster-than-light communication.",
    "The stock market fell 3.5% on Tuesday after the announcement at 10:30 AM.",
    "Le café est très bon, mais un peu cher.",
    "WHY IS EVERYONE SHOUTING???",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
    "Error 404: page not found (https://example.com/missing?id=42).",
    "A child in a yellow raincoat jumps into a puddle while her father watches from the porch.",
    " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 40),
)


@dataclass(frozen=True)
class Tolerances:
    """The pass marks; Spearman figures are in points (Spearman × 100)."""

    max_abs_hidden: float = 1e-4
    min_cosine_vs_st: float = 0.9999
    min_mean_cosine_vs_fp32: float = 0.99
    max_sts_gap_vs_st: float = 0.05
    max_sts_drop_vs_fp32: float = 0.5


DEFAULT_TOLERANCES = Tolerances()


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


# --------------------------------------------------------------------------------------------
# running the served path


@dataclass
class _Batch:
    ids: np.ndarray  # int64 [batch, seq]
    mask: np.ndarray  # int64 [batch, seq]

    def feed(self, needs_token_type_ids: bool) -> dict[str, np.ndarray]:
        feed = {"input_ids": self.ids, "attention_mask": self.mask}
        if needs_token_type_ids:
            feed["token_type_ids"] = np.zeros_like(self.ids)
        return feed


def _pad(sequences: Sequence[Sequence[int]], pad_id: int) -> _Batch:
    width = max(len(s) for s in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return _Batch(ids, mask)


def _hidden(session: onnxruntime.InferenceSession, batch: _Batch, needs_tt: bool) -> np.ndarray:
    return np.asarray(session.run([OUTPUT_NAME], batch.feed(needs_tt))[0], dtype=np.float32)


def embed_onnx(
    session: onnxruntime.InferenceSession,
    encodings: Sequence[Encoding],
    source: EmbeddingSource,
    pad_id: int,
    batch_size: int = 32,
) -> np.ndarray:
    """Pooled (and, if the pipeline does, normalised) embeddings the way the service computes them.

    Length-sorted batches like the service's batcher; results come back in input order.
    """
    order = np.argsort([len(e.ids) for e in encodings], kind="stable")
    out = np.zeros((len(encodings), source.dim), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = _pad([encodings[i].ids for i in rows], pad_id)
        pooled = pool(_hidden(session, batch, source.needs_token_type_ids), batch.mask, source.pooling)
        out[rows] = l2_normalize(pooled) if source.normalize else pooled
    return out


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((l2_normalize(a) * l2_normalize(b)).sum(axis=1), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# STS


@dataclass(frozen=True)
class StsData:
    first: list[str]
    second: list[str]
    gold: np.ndarray

    @property
    def sentences(self) -> list[str]:
        return sorted(set(self.first) | set(self.second))


def read_sts(path: Path) -> StsData:
    """STS benchmark csv: tab-separated; first seven columns; score col 4, sentences cols 5 and 6."""
    first: list[str] = []
    second: list[str] = []
    gold: list[float] = []
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) < 7:
                continue
            try:
                score = float(row[4])
            except ValueError:  # a header line
                continue
            gold.append(score)
            first.append(row[5])
            second.append(row[6])
    if len(gold) < 2:
        raise ValueError(f"{path}: fewer than two STS pairs")
    return StsData(first, second, np.asarray(gold, dtype=np.float64))


def sts_spearman(sts: StsData, embeddings: dict[str, np.ndarray]) -> float:
    """Spearman correlation × 100 between pair cosines and gold scores."""
    from scipy.stats import spearmanr

    a = np.stack([embeddings[s] for s in sts.first])
    b = np.stack([embeddings[s] for s in sts.second])
    return float(100.0 * spearmanr(_cosines(a, b), sts.gold).statistic)


# --------------------------------------------------------------------------------------------
# the references (torch world)


class _Reference:
    """The source in its own frameworks: sentence-transformers' pipeline and its torch module."""

    def __init__(self, source: EmbeddingSource, tokenizer: Tokenizer, pad_id: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.source = source
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.st = SentenceTransformer(str(source.directory), device="cpu")
        self.st.eval()
        self.module = cast("torch.nn.Module", self.st[0].auto_model)
        self.module.float()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.st.encode(list(texts), batch_size=32, convert_to_numpy=True), dtype=np.float32)

    def hidden(self, batch: _Batch) -> np.ndarray:
        import torch

        inputs = {k: torch.from_numpy(v) for k, v in batch.feed(self.source.needs_token_type_ids).items()}
        with torch.no_grad():
            return self.module(**inputs).last_hidden_state.float().numpy()

    def parity_batches(self, seed: int = 0) -> list[_Batch]:
        """The real sentences as one padded batch, plus random mixed-length padded batches."""
        real = _pad([e.ids for e in self.tokenizer.encode_batch(list(CHECK_SENTENCES))], self.pad_id)
        frame = self.tokenizer.encode("").ids  # e.g. [CLS] [SEP]: what wraps every text
        rng = np.random.default_rng(seed)
        specials = set(frame) | {self.pad_id}
        ordinary = np.array([i for i in range(self.tokenizer.get_vocab_size()) if i not in specials])
        batches = [real]
        for size in (8, 5, 3):
            longest = self.source.max_len - len(frame)
            lengths = rng.integers(1, max(2, longest + 1), size=size)
            lengths[0] = longest  # one row at the maximum length in every batch
            rows = [[*frame[:1], *rng.choice(ordinary, n).tolist(), *frame[1:]] for n in lengths]
            batches.append(_pad(rows, self.pad_id))
        return batches


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
# verification


@dataclass
class _Fp32Figures:
    """What the int8/fp16 checks compare with."""

    embeddings: np.ndarray
    sts: float | None


class _Verifier:
    def __init__(
        self,
        source: EmbeddingSource,
        tokenizer: Tokenizer,
        special: SpecialIds,
        sts: StsData | None,
        tolerances: Tolerances,
        threads: int,
        name: str,
    ) -> None:
        self.source, self.tokenizer, self.tolerances, self.threads, self.name = (
            source,
            tokenizer,
            tolerances,
            threads,
            name,
        )
        self.pad_id = special.pad
        self.sts = sts
        self.texts = list(CHECK_SENTENCES) + (sts.sentences if sts else [])
        self.encodings = tokenizer.encode_batch(self.texts)
        _log(name, f"loading the sentence-transformers reference ({len(self.texts)} check sentences)")
        self.reference = _Reference(source, tokenizer, special.pad)
        started = time.perf_counter()
        self.st_embeddings = self.reference.encode(self.texts)
        _log(name, f"sentence-transformers encoded them in {time.perf_counter() - started:.1f} s")
        self.st_sts = self._sts(self.st_embeddings)
        self.batches = self.reference.parity_batches()
        self.torch_hidden = [self.reference.hidden(b) for b in self.batches]
        self.fp32: _Fp32Figures | None = None

    def _sts(self, embeddings: np.ndarray) -> float | None:
        if self.sts is None:
            return None
        return sts_spearman(self.sts, dict(zip(self.texts, embeddings, strict=True)))

    def _max_abs_hidden(self, session: onnxruntime.InferenceSession) -> float:
        worst = 0.0
        for batch, expected in zip(self.batches, self.torch_hidden, strict=True):
            got = _hidden(session, batch, self.source.needs_token_type_ids)
            real = batch.mask.astype(bool)
            worst = max(worst, float(np.abs(got - expected)[real].max()))
        return worst

    def measure(self, variant: Variant, graph: Path) -> dict[str, float]:
        """Run the served path on ``graph``; return the parity figures, raise if out of tolerance."""
        started = time.perf_counter()
        try:
            session = cpu_session(graph, self.threads)
        except Exception as e:  # e.g. an fp16 kernel missing on the CPU provider
            raise VerificationError(
                f"{self.name}/{variant}: onnxruntime cannot load {graph.name} on CPU: {e}"
            ) from e
        embeddings = embed_onnx(session, self.encodings, self.source, self.pad_id)
        vs_st = _cosines(embeddings, self.st_embeddings)
        parity = {
            "max_abs_hidden": self._max_abs_hidden(session),
            "min_cosine_vs_st": float(vs_st.min()),
            "mean_cosine_vs_st": float(vs_st.mean()),
            "n_check_sentences": float(len(self.texts)),
        }
        score = self._sts(embeddings)
        if score is not None and self.st_sts is not None:
            parity |= {"sts_spearman": score, "sts_spearman_st": self.st_sts}
        if variant == "fp32":
            self.fp32 = _Fp32Figures(embeddings, score)
        else:
            parity |= self._vs_fp32(embeddings, score)
        _log(self.name, f"{variant}: {_format(parity)} ({time.perf_counter() - started:.1f} s)")
        self._check(variant, parity)
        return parity

    def _vs_fp32(self, embeddings: np.ndarray, score: float | None) -> dict[str, float]:
        if self.fp32 is None:
            raise RuntimeError("verify fp32 before the variants derived from it")
        vs_fp32 = _cosines(embeddings, self.fp32.embeddings)
        figures = {"mean_cosine_vs_fp32": float(vs_fp32.mean()), "min_cosine_vs_fp32": float(vs_fp32.min())}
        if score is not None and self.fp32.sts is not None:
            figures |= {"sts_spearman_fp32": self.fp32.sts, "sts_drop_vs_fp32": self.fp32.sts - score}
        return figures

    def _check(self, variant: Variant, parity: dict[str, float]) -> None:
        t = self.tolerances
        failures: list[str] = []
        if variant == "fp32":
            if not parity["max_abs_hidden"] <= t.max_abs_hidden:
                failures.append(f"max-abs hidden {parity['max_abs_hidden']:.3g} > {t.max_abs_hidden:g}")
            if not parity["min_cosine_vs_st"] >= t.min_cosine_vs_st:
                failures.append(f"min cosine vs ST {parity['min_cosine_vs_st']:.6f} < {t.min_cosine_vs_st}")
            if "sts_spearman" in parity:
                gap = abs(parity["sts_spearman"] - parity["sts_spearman_st"])
                if not gap <= t.max_sts_gap_vs_st:
                    failures.append(f"STS Spearman {gap:.3f} points from ST's > {t.max_sts_gap_vs_st}")
        else:
            if not parity["mean_cosine_vs_fp32"] >= t.min_mean_cosine_vs_fp32:
                failures.append(
                    f"mean cosine vs fp32 {parity['mean_cosine_vs_fp32']:.5f} < {t.min_mean_cosine_vs_fp32}"
                )
            if "sts_drop_vs_fp32" in parity and not parity["sts_drop_vs_fp32"] <= t.max_sts_drop_vs_fp32:
                failures.append(
                    f"STS Spearman drop {parity['sts_drop_vs_fp32']:.3f} points > {t.max_sts_drop_vs_fp32}"
                )
        if failures:
            raise VerificationError(f"{self.name}/{variant} out of tolerance: " + "; ".join(failures))


def _format(parity: dict[str, float]) -> str:
    shown = {k: v for k, v in parity.items() if k != "n_check_sentences"}
    return ", ".join(f"{k}={v:.6g}" for k, v in shown.items())


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
    target: Path, name: str, variant: Variant, sha: str, info: EmbeddingInfo, want_sts: bool
) -> bool:
    """True when ``target`` already holds this very export, intact (every sha256 checked)."""
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


def _write_variant(
    job: _Job,
    variant: Variant,
    graph: Path,
    tokenizer: Tokenizer,
    verifier: _Verifier,
    fusions: dict[str, int],
    target: Path,
) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{variant}.staging-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the published artefact from other users
    try:
        shutil.copyfile(graph, staging / GRAPH_FILE)
        tokenizer.save(str(staging / TOKENIZER_FILE))
        parity = verifier.measure(variant, staging / GRAPH_FILE)
        opset, ir_version = opset_and_ir(staging / GRAPH_FILE)
        manifest = Manifest(
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
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        write_manifest(staging, manifest)
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
) -> list[Path]:
    """Export, verify and publish ``variants`` of an embedding model; return the artefact dirs.

    ``name`` defaults to the source directory's name; ``threads`` (default: torch's current
    setting) sizes the onnxruntime sessions used for verification. Variants already up to date
    (same source hash, intact files) are skipped. Raises VerificationError when a variant is out
    of tolerance (nothing published for it), ValueError for a source it cannot export.
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
    todo = [v for v in wanted if not _up_to_date(targets[v], name, v, sha, source.info(), want_sts)]
    for v in wanted:
        if v not in todo:
            _log(name, f"{v}: up to date ({targets[v]})")
    if not todo:
        return [targets[v] for v in wanted]

    import torch

    (out_root / name).mkdir(parents=True, exist_ok=True)
    tokenizer = served_tokenizer(source_dir, source.max_len)
    job = _Job(source, name, sha, _special_ids(tokenizer, source_dir))
    verifier = _Verifier(
        source,
        tokenizer,
        job.special,
        read_sts(sts_csv) if sts_csv else None,
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
    verifier: _Verifier,
    work: Path,
) -> list[Path]:
    name, source = job.name, job.source
    plain = work / "plain.onnx"
    _log(name, f"exporting {source.model_type} (dim {source.dim}, {source.pooling} pooling) to ONNX")
    _export_plain_graph(source, plain)
    # fp32 is the reference of the other variants: always verified, published only if asked for
    if "fp32" in todo:
        _write_variant(job, "fp32", plain, tokenizer, verifier, {}, targets["fp32"])
    else:
        verifier.measure("fp32", plain)
    if "int8" in todo:
        _log(name, "quantizing to int8 (dynamic, per-channel QInt8 weights)")
        quantize_int8(plain, work / "int8.onnx")
        _write_variant(job, "int8", work / "int8.onnx", tokenizer, verifier, {}, targets["int8"])
    if "fp16" in todo:
        _log(name, "fusing (onnxruntime transformer optimizer) and converting to fp16")
        fusions = optimize(plain, work / "fused.onnx", "bert", source.num_heads, source.dim)
        _log(name, f"fusions: {fusions}")
        to_fp16(work / "fused.onnx", work / "fp16.onnx")
        _write_variant(job, "fp16", work / "fp16.onnx", tokenizer, verifier, fusions, targets["fp16"])
    return [targets[v] for v in wanted]
