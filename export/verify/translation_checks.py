"""Verifying a translation artefact through the service's own engine, against PyTorch.

Everything here runs the staged artefact directory as the service does: loaded with
``service.engine.loader.load_engine`` and decoded with ``OnnxTranslator.translate`` (the greedy
checks, BLEU, the reference set). Only the fp32-vs-PyTorch parity of raw graph outputs (memory
K/V, per-step log-probs and cross-attention) drives the graphs step by step, and it does so with
the engine's own backend and incremental decoder (``OnnxTranslator.new_decoder``), the same
objects the search uses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from export.sources import TranslationSource
from export.sources.ours.data import (
    encode_source,
    length_sorted_batches,
    output_limits,
    pad_array,
    read_lines,
)
from export.verify import VerificationError
from service.engine.base import TranslateItem, TranslateOptions
from service.engine.loader import load_engine
from service.engine.session import SessionConfig
from service.engine.translation.decoding import Decoder
from service.engine.translation.translator import OnnxTranslator

NEAR_TIE = 1e-3  # a greedy divergence where PyTorch's top two log-probs are closer is a tie, not a bug
EVAL_BEAM, EVAL_BATCH = 4, 32
TEST_SPLIT, VAL_SPLIT = "test_2016_flickr", "val"
VAL_GREEDY_SENTENCES = 100
MAX_FORCED_STEPS = 40  # teacher-forced parity steps per built-in sentence (a prefix of its output)
FLOOR = -1e9  # log-probs of suppressed tokens (-inf in PyTorch, the lowest float in the graph) compare equal

# Real sentences for parity and greedy checks, independent of any data directory.
BUILTIN_SENTENCES = [
    "A man is riding a bike down the street.",
    "Two young children are playing in the sand on the beach.",
    "A woman in a red dress is walking her dog.",
    "A group of people are standing in front of a large building.",
    "The little girl is climbing a tree.",
    "Three men are working on the roof of a house.",
    "A black dog runs through the snow.",
    "An old man sits on a bench and reads a newspaper.",
    "A boy jumps into the swimming pool.",
    "Several people are waiting for the bus at night.",
    "A musician plays the guitar on a stage.",
    "Hello!",
]


def open_engine(directory: Path, threads: int = 2, shortlist: bool = False) -> OnnxTranslator:
    """The staged artefact as the service loads it (CPU, sha256-verified), cutting over-long
    sources as ``encode_sources`` does instead of failing them."""
    engine = load_engine(directory, SessionConfig("cpu", threads, allow_spinning=False), shortlist=shortlist)
    if not isinstance(engine, OnnxTranslator):
        raise VerificationError(f"{directory}: not a translation artefact")
    engine.truncate_source = True
    return engine


def encode_sources(source: TranslationSource, texts: Sequence[str]) -> list[list[int]]:
    """Source ids with </s> (the tokenizer's post-processor), truncated keeping the </s>."""
    return encode_source(source.tokenizer, texts, source.max_source_len)


def translate_ids(
    engine: OnnxTranslator,
    source: TranslationSource,
    texts: Sequence[str],
    beam_size: int,
    batch_size: int = EVAL_BATCH,
    limits: Sequence[int] | None = None,
) -> list[list[int]]:
    """Best hypothesis ids per text through ``engine.translate``, in length-sorted batches (as the
    service's queue sends them), each sentence stopped at ``limits`` (default: its
    ``output_limits``), with the source's length penalty (what requests get by default)."""
    src_ids = encode_sources(source, texts)
    limits = limits or output_limits(src_ids, source.max_target_len)
    out: list[list[int]] = [[] for _ in texts]
    penalty = source.length_penalty
    for chunk in length_sorted_batches([len(s) for s in src_ids], batch_size):
        items = [
            TranslateItem(texts[i], TranslateOptions(beam_size, max_length=limits[i], length_penalty=penalty))
            for i in chunk
        ]
        for i, result in zip(chunk, engine.translate(items), strict=True):
            if isinstance(result, Exception):
                raise VerificationError(f"the engine failed on {texts[i]!r}: {result}") from result
            out[i] = [_token_id(source, piece) for piece in result.hypotheses[0].tokens]
    return out


def _token_id(source: TranslationSource, piece: str) -> int:
    token_id = source.tokenizer.token_to_id(piece)
    if token_id is None:
        raise VerificationError(f"the engine returned {piece!r}, which is not in the vocabulary")
    return int(token_id)


# --- fp32 parity of raw graph outputs -----------------------------------------------------------


def random_batches(source: TranslationSource, seed: int = 0) -> Iterator[np.ndarray]:
    """Padded batches of random ids of mixed lengths (1 row; 4 rows up to 12; 7 rows up to 30)."""
    rng = np.random.default_rng(seed)
    sp = source.special
    assert sp.eos is not None
    banned = {sp.pad, sp.bos, sp.eos}
    allowed = np.array([i for i in range(source.vocab_size) if i not in banned])
    for rows, longest in ((1, 6), (4, 12), (7, 30)):
        lengths = rng.integers(1, longest + 1, size=rows)
        lengths[0] = longest
        yield pad_array([[*rng.choice(allowed, size=n - 1).tolist(), sp.eos] for n in lengths], sp.pad)


@dataclass
class Figures:
    """Running maxima of |ONNX - PyTorch| per output."""

    memory: float = 0.0
    log_probs: float = 0.0
    attention: float = 0.0

    def update(self, name: str, onnx_value: np.ndarray, torch_value: np.ndarray | torch.Tensor) -> None:
        ref = torch_value.numpy() if isinstance(torch_value, torch.Tensor) else torch_value
        diff = float(
            np.max(np.abs(np.maximum(onnx_value.astype(np.float32), FLOOR) - np.maximum(ref, FLOOR)))
        )
        setattr(self, name, max(getattr(self, name), diff))

    def as_parity(self) -> dict[str, float]:
        return {
            "max_abs_memory": self.memory,
            "max_abs_log_probs": self.log_probs,
            "max_abs_cross_attention": self.attention,
        }


def engine_decoder(
    engine: OnnxTranslator, src: np.ndarray, pad_id: int
) -> tuple[Decoder, tuple[np.ndarray, np.ndarray]]:
    """The engine's own incremental decoder over padded ``src`` (with cross-attention), and the
    encoder's memory K/V it runs on."""
    memory = engine.backend.encode(src)
    decoder = engine.new_decoder(with_attention=True)
    decoder.admit(memory, (src != pad_id).astype(np.int64), [1] * len(src))
    return decoder, memory


def compare_steps(
    engine: OnnxTranslator, source: TranslationSource, src: np.ndarray, tokens: np.ndarray, figures: Figures
) -> None:
    """Encoder outputs, then one cached step per column of ``tokens`` (N, T) fed to both sides."""
    onnx_dec, (keys, values) = engine_decoder(engine, src, source.special.pad)
    ref_keys, ref_values = source.reference.memory_kv(torch.from_numpy(src))
    figures.update("memory", np.asarray(keys), ref_keys)
    figures.update("memory", np.asarray(values), ref_values)
    ref_dec = source.reference.decoder(torch.from_numpy(src))
    for t in range(tokens.shape[1]):
        log_probs, attn = onnx_dec.step(tokens[:, t])
        ref_log_probs, ref_attn = ref_dec.step(tokens[:, t])
        figures.update("log_probs", log_probs, ref_log_probs)
        assert attn is not None and ref_attn is not None
        figures.update("attention", attn, ref_attn)


def parity(engine: OnnxTranslator, source: TranslationSource, builtin_greedy: list[list[int]]) -> Figures:
    """Step-by-step figures on the built-in sentences (teacher-forced with PyTorch's greedy output,
    the real distribution of states) and on random padded batches (random tokens, 6 steps)."""
    figures = Figures()
    sp = source.special
    assert sp.bos is not None and sp.eos is not None
    src = pad_array(encode_sources(source, BUILTIN_SENTENCES), sp.pad)
    width = min(max(len(g) for g in builtin_greedy) + 1, MAX_FORCED_STEPS)  # <s> y_1 … (a prefix)
    forced = np.array([([sp.bos, *g] + [sp.eos] * width)[:width] for g in builtin_greedy], dtype=np.int64)
    compare_steps(engine, source, src, forced, figures)
    rng = np.random.default_rng(1)
    for batch in random_batches(source):
        steps = rng.integers(4, source.vocab_size, size=(len(batch), 6))
        steps[:, 0] = sp.bos
        compare_steps(engine, source, batch, steps, figures)
    return figures


# --- greedy tokens against PyTorch ----------------------------------------------------------------


@dataclass
class GreedyCheck:
    sentences: int = 0
    mismatches: list[int] = field(default_factory=list)  # indices not explained by a near tie
    near_ties: int = 0


def check_greedy(
    engine: OnnxTranslator, source: TranslationSource, texts: Sequence[str], reference: list[list[int]]
) -> GreedyCheck:
    """The engine's greedy output against PyTorch's greedy tokens.

    A divergence counts as a near tie (not a failure) when PyTorch's own log-probs of the two
    competing tokens at that step differ by less than ``NEAR_TIE``."""
    got = translate_ids(engine, source, texts, beam_size=1)
    src_ids = encode_sources(source, texts)
    check = GreedyCheck(sentences=len(texts))
    for i, (a, b) in enumerate(zip(got, reference, strict=True)):
        if a == b:
            continue
        if _is_near_tie(source, src_ids[i], a, b):
            check.near_ties += 1
        else:
            check.mismatches.append(i)
    return check


def _is_near_tie(source: TranslationSource, src_ids: Sequence[int], got: list[int], want: list[int]) -> bool:
    sp = source.special
    assert sp.bos is not None and sp.eos is not None
    at = next(
        (j for j, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), min(len(got), len(want))
    )
    dec = source.reference.decoder(torch.tensor([list(src_ids)]))
    log_probs = np.zeros(0)
    for token in [sp.bos, *want[:at]]:
        log_probs, _ = dec.step(np.array([token], dtype=np.int64))
    a = got[at] if at < len(got) else sp.eos
    b = want[at] if at < len(want) else sp.eos
    return bool(abs(float(log_probs[0, a]) - float(log_probs[0, b])) < NEAR_TIE)


def greedy_agreement(
    engine: OnnxTranslator, source: TranslationSource, texts: Sequence[str], reference: list[list[int]]
) -> float:
    """Fraction of sentences whose greedy output equals PyTorch's (a figure for int8/fp16)."""
    got = translate_ids(engine, source, texts, beam_size=1)
    return sum(a == b for a, b in zip(got, reference, strict=True)) / max(len(texts), 1)


# --- BLEU with --eval-dir -------------------------------------------------------------------------


def _find(directory: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (directory / name).is_file():
            return directory / name
    return None


@dataclass(frozen=True)
class BleuResult:
    bleu: float
    tokens_per_s: float
    sentences: int


def eval_bleu(engine: OnnxTranslator, source: TranslationSource, eval_dir: Path) -> BleuResult | None:
    """sacreBLEU (beam 4, batches of 32) of the engine on the test set, if ``eval_dir`` has it."""
    import sacrebleu

    src_path = _find(eval_dir, f"{TEST_SPLIT}.{source.source_languages[0]}")
    ref_path = _find(eval_dir, f"{TEST_SPLIT}.{source.target_languages[0]}")
    if src_path is None or ref_path is None:
        return None
    sources, references = read_lines(src_path), read_lines(ref_path)
    start = time.perf_counter()
    hyps = translate_ids(engine, source, sources, EVAL_BEAM)
    seconds = time.perf_counter() - start
    texts = source.tokenizer.decode_batch(hyps)
    score = sacrebleu.corpus_bleu(texts, [references]).score
    n_tokens = sum(len(h) + 1 for h in hyps)  # + </s>
    return BleuResult(bleu=score, tokens_per_s=n_tokens / seconds, sentences=len(sources))


def validation_texts(source: TranslationSource, eval_dir: Path | None) -> list[str]:
    if eval_dir is None:
        return []
    path = _find(eval_dir, f"{VAL_SPLIT}.{source.source_languages[0]}")
    if path is None:
        return []
    return [s for s in read_lines(path) if s.strip()][:VAL_GREEDY_SENTENCES]
