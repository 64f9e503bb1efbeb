"""Verifying an embedding artefact through the service's own engine, against its source.

Every variant is staged with a manifest and loaded with ``service.engine.loader.load_engine``;
its embeddings come from ``OnnxEmbedder.embed`` (the served tokenizer copy, the engine's own
length-sorted sub-batches, the graph's own pooling and normalisation) and are compared with the
source frameworks:

* fp32 pooled vectors vs PyTorch's hidden states pooled by sentence-transformers' Pooling module,
  max-abs ≤ 1e-4, on real sentences and on random mixed-length padded batches (the only check
  that feeds the engine's session directly: raw graph outputs);
* pooled embeddings vs ``SentenceTransformer(dir).encode``: min cosine ≥ 0.9999 (fp32);
* int8/fp16: mean cosine to fp32 ≥ 0.99;
* with an STS csv: Spearman (×100, "points") of fp32 within 0.05 points of
  sentence-transformers', int8/fp16 at most 0.5 points below fp32;
* every variant: the reference sentences (export/verify/reference_set.py) alone vs in mixed batches, and
  int8/fp16 against fp32 on them, written into ``Manifest.reference_check``.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from export.progress import progress
from export.sources.ours.data import pad_array
from export.verify import VerificationError, load_staged
from export.verify.determinism import EmbeddingDeterminism, cosines, embedding_determinism
from export.verify.reference_set import ReferenceSet, embedding_check
from service.artefacts import (
    EMBEDDING_ATTENTION_MASK,
    EMBEDDING_INPUT_IDS,
    EMBEDDING_OUTPUT,
    EMBEDDING_TOKEN_TYPE_IDS,
    ReferenceCheck,
    Variant,
)
from service.engine.base import EmbedItem
from service.engine.loader import load_engine
from service.engine.session import SessionConfig

if TYPE_CHECKING:
    import onnxruntime
    import torch
    from tokenizers import Tokenizer

    from export.sources.bert import EmbeddingSource
    from service.engine.embedder import OnnxEmbedder

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

    max_abs_pooled: float = 1e-4
    min_cosine_vs_st: float = 0.9999
    min_mean_cosine_vs_fp32: float = 0.99
    max_sts_gap_vs_st: float = 0.05
    max_sts_drop_vs_fp32: float = 0.5


DEFAULT_TOLERANCES = Tolerances()

# --------------------------------------------------------------------------------------------
# running the served path


@dataclass
class _Batch:
    ids: np.ndarray  # int64 [batch, seq]
    mask: np.ndarray  # int64 [batch, seq]

    def feed(self, needs_token_type_ids: bool) -> dict[str, np.ndarray]:
        feed = {EMBEDDING_INPUT_IDS: self.ids, EMBEDDING_ATTENTION_MASK: self.mask}
        if needs_token_type_ids:
            feed[EMBEDDING_TOKEN_TYPE_IDS] = np.zeros_like(self.ids)
        return feed


def _pad(sequences: Sequence[Sequence[int]], pad_id: int) -> _Batch:
    ids = pad_array(sequences, pad_id)
    lengths = np.array([len(s) for s in sequences])
    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
    return _Batch(ids, mask)


def _pooled(session: onnxruntime.InferenceSession, batch: _Batch, needs_tt: bool) -> np.ndarray:
    return np.asarray(session.run([EMBEDDING_OUTPUT], batch.feed(needs_tt))[0], dtype=np.float32)


def open_engine(directory: Path, threads: int) -> OnnxEmbedder:
    """The staged artefact as the service loads it (CPU, sha256-verified)."""
    from service.engine.embedder import OnnxEmbedder

    engine = load_engine(directory, SessionConfig("cpu", threads, allow_spinning=False))
    if not isinstance(engine, OnnxEmbedder):
        raise VerificationError(f"{directory}: not an embedding artefact")
    return engine


def embed(engine: OnnxEmbedder, texts: Sequence[str], normalize: bool) -> np.ndarray:
    """Embeddings through ``engine.embed`` (one call: the engine sub-batches by length), L2
    normalised by the graph when the pipeline does it, each text after the model's default prompt:
    as the API returns them, and as sentence-transformers' ``encode`` does."""
    prompt = engine.info.prompt(None)
    vectors = []
    items = [EmbedItem(prompt + t, normalize=normalize) for t in texts]
    for text, result in zip(texts, engine.embed(items), strict=True):
        if isinstance(result, Exception):
            raise VerificationError(f"the engine failed on {text!r}: {result}") from result
        vectors.append(result.vector)
    return np.stack(vectors).astype(np.float32)


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
    return float(100.0 * spearmanr(cosines(a, b), sts.gold).statistic)


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

    def pooled(self, batch: _Batch) -> np.ndarray:
        """The module's hidden states through sentence-transformers' own Pooling module."""
        import torch

        inputs = {k: torch.from_numpy(v) for k, v in batch.feed(self.source.needs_token_type_ids).items()}
        with torch.no_grad():
            hidden = self.module(**inputs).last_hidden_state.float()
            features = {"token_embeddings": hidden, "attention_mask": inputs[EMBEDDING_ATTENTION_MASK]}
            pooled = self.st[1](features)["sentence_embedding"]
        return np.asarray(pooled.numpy(), dtype=np.float32)

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


# --------------------------------------------------------------------------------------------
# verification


@dataclass
class _Fp32Figures:
    """What the int8/fp16 checks compare with."""

    embeddings: np.ndarray
    sts: float | None
    determinism: EmbeddingDeterminism


class EmbeddingVerifier:
    """The references of one source, computed once; ``verify`` checks one staged variant."""

    def __init__(
        self,
        source: EmbeddingSource,
        tokenizer: Tokenizer,
        pad_id: int,
        sts: StsData | None,
        reference_set: ReferenceSet,
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
        self.pad_id = pad_id
        self.sts = sts
        self.reference_set = reference_set
        self.texts = list(CHECK_SENTENCES) + (sts.sentences if sts else [])
        progress(f"{name}: loading the sentence-transformers reference ({len(self.texts)} check sentences)")
        self.reference = _Reference(source, tokenizer, pad_id)
        started = time.perf_counter()
        self.st_embeddings = self.reference.encode(self.texts)
        progress(f"{name}: sentence-transformers encoded them in {time.perf_counter() - started:.1f} s")
        self.st_sts = self._sts(self.st_embeddings)
        self.batches = self.reference.parity_batches()
        self.torch_pooled = [self.reference.pooled(b) for b in self.batches]
        self.fp32: _Fp32Figures | None = None

    def _sts(self, embeddings: np.ndarray) -> float | None:
        if self.sts is None:
            return None
        return sts_spearman(self.sts, dict(zip(self.texts, embeddings, strict=True)))

    def _max_abs_pooled(self, session: onnxruntime.InferenceSession) -> float:
        worst = 0.0
        for batch, expected in zip(self.batches, self.torch_pooled, strict=True):
            got = _pooled(session, batch, self.source.needs_token_type_ids)
            worst = max(worst, float(np.abs(got - expected).max()))
        return worst

    def verify(self, variant: Variant, directory: Path) -> tuple[dict[str, float], ReferenceCheck]:
        """Load the staged ``directory`` as the service does and check it; return the parity
        figures and the reference check, raise VerificationError when out of tolerance."""
        started = time.perf_counter()
        engine = load_staged(open_engine, directory, self.threads, f"{self.name}/{variant}")
        embeddings = embed(engine, self.texts, self.source.normalize)
        vs_st = cosines(embeddings, self.st_embeddings)
        parity = {
            "max_abs_pooled": self._max_abs_pooled(engine.session),
            "min_cosine_vs_st": float(vs_st.min()),
            "mean_cosine_vs_st": float(vs_st.mean()),
            "n_check_sentences": float(len(self.texts)),
        }
        score = self._sts(embeddings)
        if score is not None and self.st_sts is not None:
            parity |= {"sts_spearman": score, "sts_spearman_st": self.st_sts}
        determinism = embedding_determinism(engine, self.reference_set.sentences)
        if variant == "fp32":
            self.fp32 = _Fp32Figures(embeddings, score, determinism)
        else:
            parity |= self._vs_fp32(embeddings, score)
        assert self.fp32 is not None
        baseline = None if variant == "fp32" else self.fp32.determinism
        check, failures = embedding_check(self.reference_set, determinism, baseline, variant != "fp16")
        progress(f"  {variant}: {_format(parity)} ({time.perf_counter() - started:.1f} s)")
        progress(f"  {variant}: reference check {check.figures}")
        self._check(variant, parity, failures)
        return parity, check

    def _vs_fp32(self, embeddings: np.ndarray, score: float | None) -> dict[str, float]:
        if self.fp32 is None:
            raise RuntimeError("verify fp32 before the variants derived from it")
        vs_fp32 = cosines(embeddings, self.fp32.embeddings)
        figures = {"mean_cosine_vs_fp32": float(vs_fp32.mean()), "min_cosine_vs_fp32": float(vs_fp32.min())}
        if score is not None and self.fp32.sts is not None:
            figures |= {"sts_spearman_fp32": self.fp32.sts, "sts_drop_vs_fp32": self.fp32.sts - score}
        return figures

    def _check(self, variant: Variant, parity: dict[str, float], failures: list[str]) -> None:
        t = self.tolerances
        if variant == "fp32":
            if not parity["max_abs_pooled"] <= t.max_abs_pooled:
                failures.append(f"max-abs pooled {parity['max_abs_pooled']:.3g} > {t.max_abs_pooled:g}")
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
