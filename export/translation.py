"""Export a translation checkpoint (ours or Marian) to verified ONNX artefacts, one per variant.

    export_translation(Path("export/checkpoints/transformer-en-de"), Path(".artefacts"),
                       ["fp32", "int8", "fp16"], eval_dir=Path("../shared/data/multi30k"))

writes ``<out_root>/<name>/<variant>/{encoder.onnx, decoder.onnx, tokenizer.json, manifest.json}``
in the layout of ``export.translation_graphs``. Nothing is trusted unverified: a variant's
manifest is written only after its graphs, run in onnxruntime, matched the source framework:

* fp32: memory K/V, log-probs and alignments within ``FP32_TOLERANCE`` of PyTorch on real
  sentences (the built-in list below, decoded step by step with the cache) and random padded
  batches of mixed lengths; and the cached ONNX decoder, driven by the service's own search
  (``service.engine.search``), yields the same greedy tokens as PyTorch on the built-in sentences
  and on the first ``VAL_GREEDY_SENTENCES`` validation sentences when ``eval_dir`` has them.
* int8 / fp16: the same figures are recorded (not bounded), and when ``eval_dir`` has the test
  set, sacreBLEU with beam 4 may drop at most ``MAX_BLEU_DROP`` below the fp32 graph's.

A variant whose manifest already names the same source weights and still verifies is skipped,
so re-running the export is cheap.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.data import read_lines
from export.onnx_tools import (
    VerificationError,
    cpu_session,
    file_entries,
    graph_spec,
    opset_and_ir,
    optimize,
    quantize_int8,
    source_sha256,
)
from export.sources import TranslationSource
from export.translation_graphs import example_inputs, export_graphs, load_ours
from service.artefacts import (
    ArtefactError,
    Manifest,
    SourceInfo,
    TranslationInfo,
    load_and_verify,
    read_manifest,
    sha256_of,
    write_manifest,
)
from service.engine.search import beam_search

VARIANTS = ("fp32", "int8", "fp16")
FP32_TOLERANCE = 1e-4  # max |ONNX - PyTorch| on memory K/V, log-probs and alignments
MAX_BLEU_DROP = 0.5  # int8/fp16 vs fp32, sacreBLEU points on the test set
VAL_GREEDY_SENTENCES = 100
NEAR_TIE = 1e-3  # a greedy divergence where PyTorch's top two log-probs are closer is a tie, not a bug
EVAL_BEAM, EVAL_BATCH = 4, 32
TEST_SPLIT, VAL_SPLIT = "test_2016_flickr", "val"
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


__all__ = ["VerificationError", "export_translation"]  # VerificationError: onnx_tools' shared one


def progress(message: str) -> None:
    print(f"[export] {message}", file=sys.stderr, flush=True)


# --- onnxruntime side: sessions and the search adapter ------------------------------------------

_NP_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


class OrtTranslator:
    """The encoder/decoder sessions of one artefact directory, on CPU as the service makes them."""

    def __init__(self, directory: Path, threads: int = 2) -> None:
        self.encoder = cpu_session(directory / "encoder.onnx", threads)
        self.decoder = cpu_session(directory / "decoder.onnx", threads)
        past = next(i for i in self.decoder.get_inputs() if i.name == "past_keys")
        self.kv_dtype = _NP_DTYPES[past.type]
        self.n_layers, self.n_heads, self.d_head = (int(past.shape[i]) for i in (0, 2, 4))

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys, values = self.encoder.run(None, {"input_ids": src})
        return keys, values

    def step(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        memory: tuple[np.ndarray, np.ndarray],
        past: tuple[np.ndarray, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(N,) tokens → log_probs, present keys, present values, cross_attention."""
        feeds = {
            "input_ids": tokens[:, None].astype(np.int64),
            "source_mask": mask,
            "memory_keys": memory[0],
            "memory_values": memory[1],
            "past_keys": past[0],
            "past_values": past[1],
        }
        log_probs, keys, values, attn = self.decoder.run(None, feeds)
        return log_probs, keys, values, attn

    def empty_past(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        empty = np.zeros((self.n_layers, rows, self.n_heads, 0, self.d_head), self.kv_dtype)
        return empty, empty


class OrtDecoder:
    """The ONNX decoder behind the search's ``IncrementalDecoder`` protocol.

    Memory K/V are gathered again only when the rows' sentences change (sentences finishing),
    not when beams of one sentence swap places: they share the same memory.
    """

    def __init__(self, translator: OrtTranslator, src: np.ndarray, pad_id: int) -> None:
        self.t = translator
        self.base_memory = translator.encode(src)
        self.base_mask = (src != pad_id).astype(np.int64)
        self.sentence = np.arange(len(src))
        self.memory, self.mask = self.base_memory, self.base_mask
        self.past = translator.empty_past(len(src))

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        log_probs, keys, values, attn = self.t.step(last_tokens, self.mask, self.memory, self.past)
        self.past = (keys, values)
        return log_probs, attn

    def reorder(self, rows: np.ndarray) -> None:
        sentence = self.sentence[rows]
        if not np.array_equal(sentence, self.sentence):
            self.memory = (self.base_memory[0][:, sentence], self.base_memory[1][:, sentence])
            self.mask, self.sentence = self.base_mask[sentence], sentence
        self.past = (self.past[0][:, rows], self.past[1][:, rows])


def default_limits(src_ids: Sequence[Sequence[int]], max_target_len: int) -> list[int]:
    """Each sentence's own output limit (as ``export.translate``): 2 × source + 10 tokens."""
    return [min(max_target_len - 1, 2 * len(s) + 10) for s in src_ids]


def onnx_translate_ids(
    translator: OrtTranslator,
    source: TranslationSource,
    src_ids: Sequence[Sequence[int]],
    beam_size: int,
    max_lens: Sequence[int],
    batch_size: int = EVAL_BATCH,
) -> list[list[int]]:
    """Best hypothesis per source through the ONNX graphs, in length-sorted batches."""
    sp = source.special
    assert sp.bos is not None and sp.eos is not None
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    out: list[list[int]] = [[] for _ in src_ids]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        hyps = beam_search(
            OrtDecoder(translator, _pad([src_ids[i] for i in chunk], sp.pad), sp.pad),
            len(chunk),
            beam_size=beam_size,
            max_len=[max_lens[i] for i in chunk],
            bos_id=sp.bos,
            eos_id=sp.eos,
        )
        for i, h in zip(chunk, hyps, strict=True):
            out[i] = h[0].tokens
    return out


def _pad(seqs: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    width = max(len(s) for s in seqs)
    return np.array([list(s) + [pad_id] * (width - len(s)) for s in seqs], dtype=np.int64)


# --- verification ---------------------------------------------------------------------------------


def encode_sources(source: TranslationSource, texts: Sequence[str]) -> list[list[int]]:
    """Source ids with </s> (the tokenizer's post-processor), truncated keeping the </s>."""
    limit = source.max_source_len
    out = []
    for enc in source.tokenizer.encode_batch(list(texts)):
        ids = enc.ids
        out.append(ids if len(ids) <= limit else [*ids[: limit - 1], ids[-1]])
    return out


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
        yield _pad([[*rng.choice(allowed, size=n - 1).tolist(), sp.eos] for n in lengths], sp.pad)


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


def compare_steps(
    translator: OrtTranslator,
    source: TranslationSource,
    src: np.ndarray,
    tokens: np.ndarray,
    figures: Figures,
) -> None:
    """Encoder outputs, then one cached step per column of ``tokens`` (N, T) fed to both sides."""
    keys, values = translator.encode(src)
    ref_keys, ref_values = source.reference.memory_kv(torch.from_numpy(src))
    figures.update("memory", keys, ref_keys)
    figures.update("memory", values, ref_values)
    onnx_dec = OrtDecoder(translator, src, source.special.pad)
    ref_dec = source.reference.decoder(torch.from_numpy(src))
    for t in range(tokens.shape[1]):
        log_probs, attn = onnx_dec.step(tokens[:, t])
        ref_log_probs, ref_attn = ref_dec.step(tokens[:, t])
        figures.update("log_probs", log_probs, ref_log_probs)
        assert attn is not None and ref_attn is not None
        figures.update("attention", attn, ref_attn)


def parity(translator: OrtTranslator, source: TranslationSource, builtin_greedy: list[list[int]]) -> Figures:
    """Step-by-step figures on the built-in sentences (teacher-forced with PyTorch's greedy output,
    the real distribution of states) and on random padded batches (random tokens, 6 steps)."""
    figures = Figures()
    sp = source.special
    assert sp.bos is not None and sp.eos is not None
    src_ids = encode_sources(source, BUILTIN_SENTENCES)
    src = _pad(src_ids, sp.pad)
    width = min(max(len(g) for g in builtin_greedy) + 1, MAX_FORCED_STEPS)  # <s> y_1 … (a prefix)
    forced = np.array([([sp.bos, *g] + [sp.eos] * width)[:width] for g in builtin_greedy], dtype=np.int64)
    compare_steps(translator, source, src, forced, figures)
    rng = np.random.default_rng(1)
    for batch in random_batches(source):
        steps = rng.integers(4, source.vocab_size, size=(len(batch), 6))
        steps[:, 0] = sp.bos
        compare_steps(translator, source, batch, steps, figures)
    return figures


@dataclass
class GreedyCheck:
    sentences: int = 0
    mismatches: list[int] = field(default_factory=list)  # indices not explained by a near tie
    near_ties: int = 0


def check_greedy(
    translator: OrtTranslator,
    source: TranslationSource,
    src_ids: Sequence[Sequence[int]],
    reference: list[list[int]],
) -> GreedyCheck:
    """The cached ONNX decoder under the service's search (beam 1) against PyTorch's greedy tokens.

    A divergence counts as a near tie (not a failure) when PyTorch's own log-probs of the two
    competing tokens at that step differ by less than ``NEAR_TIE``."""
    limits = default_limits(src_ids, source.max_target_len)
    got = onnx_translate_ids(translator, source, src_ids, beam_size=1, max_lens=limits)
    check = GreedyCheck(sentences=len(src_ids))
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
    translator: OrtTranslator,
    source: TranslationSource,
    src_ids: Sequence[Sequence[int]],
    reference: list[list[int]],
) -> float:
    """Fraction of sentences whose ONNX greedy output equals PyTorch's (a figure for int8/fp16)."""
    got = onnx_translate_ids(translator, source, src_ids, 1, default_limits(src_ids, source.max_target_len))
    return sum(a == b for a, b in zip(got, reference, strict=True)) / max(len(src_ids), 1)


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


def eval_bleu(translator: OrtTranslator, source: TranslationSource, eval_dir: Path) -> BleuResult | None:
    """sacreBLEU (beam 4, batches of 32) of the ONNX graphs on the test set, if ``eval_dir`` has it."""
    import sacrebleu

    src_path = _find(eval_dir, f"{TEST_SPLIT}.{source.source_languages[0]}")
    ref_path = _find(eval_dir, f"{TEST_SPLIT}.{source.target_languages[0]}")
    if src_path is None or ref_path is None:
        return None
    sources, references = read_lines(src_path), read_lines(ref_path)
    src_ids = encode_sources(source, sources)
    start = time.perf_counter()
    hyps = onnx_translate_ids(
        translator, source, src_ids, EVAL_BEAM, default_limits(src_ids, source.max_target_len)
    )
    seconds = time.perf_counter() - start
    texts = source.tokenizer.decode_batch(hyps)
    score = sacrebleu.corpus_bleu(texts, [references]).score
    n_tokens = sum(len(h) + 1 for h in hyps)  # + </s>
    return BleuResult(bleu=score, tokens_per_s=n_tokens / seconds, sentences=len(sources))


def validation_ids(source: TranslationSource, eval_dir: Path | None) -> list[list[int]]:
    if eval_dir is None:
        return []
    path = _find(eval_dir, f"{VAL_SPLIT}.{source.source_languages[0]}")
    if path is None:
        return []
    return encode_sources(source, [s for s in read_lines(path) if s.strip()][:VAL_GREEDY_SENTENCES])


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


def build_fp32(source: TranslationSource, out_dir: Path) -> dict[str, int]:
    """Traced, then optimised fp32 graphs in ``out_dir``; returns the fusion counts."""
    encoder, decoder = source.build_graphs(torch.float32)
    export_raw(source, encoder, decoder, torch.float32, out_dir)
    return _merge_fusions(*(optimize_graph(out_dir / f, source) for f in ("encoder.onnx", "decoder.onnx")))


def export_raw(
    source: TranslationSource,
    encoder: torch.nn.Module,
    decoder: torch.nn.Module,
    dtype: torch.dtype,
    out_dir: Path,
) -> None:
    src, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, dtype, source.special.pad
    )
    export_graphs(encoder, decoder, src, step, out_dir)


def build_int8(fp32_dir: Path, out_dir: Path) -> dict[str, int]:
    for name in ("encoder.onnx", "decoder.onnx"):
        quantize_int8(fp32_dir / name, out_dir / name)  # per-channel, MatMul weights (VNNI path)
    return _count_ops(out_dir, ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear"))


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
        ),
        opset=opset,
        ir_version=ir_version,
        onnxruntime_version=ort.__version__,
        parity={k: round(float(v), 8) for k, v in parity_figures.items()},
        fusions=fusions,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def write_tokenizer(source: TranslationSource, directory: Path) -> None:
    if source.tokenizer_file is not None:
        shutil.copyfile(source.tokenizer_file, directory / "tokenizer.json")  # byte for byte
    else:
        source.tokenizer.save(str(directory / "tokenizer.json"))


def up_to_date(directory: Path, source: TranslationSource, sha: str, variant: str) -> bool:
    """A verified artefact of the same weights (and tokenizer) and variant is already there."""
    try:
        manifest = load_and_verify(directory)
    except ArtefactError:
        return False
    if manifest.source.sha256 != sha or manifest.variant != variant or manifest.task != "translate":
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
    """One source's variants: shared fp32 graphs, PyTorch references and BLEU baseline."""

    def __init__(self, source: TranslationSource, sha: str, eval_dir: Path | None, work: Path) -> None:
        self.source, self.sha, self.eval_dir, self.work = source, sha, eval_dir, work
        self.builtin_ids = encode_sources(source, BUILTIN_SENTENCES)
        self.val_ids = validation_ids(source, eval_dir)
        self._fp32: tuple[Path, dict[str, int]] | None = None
        self._reference: dict[str, list[list[int]]] = {}
        self._bleu_fp32: BleuResult | None = None

    def reference_greedy(self, which: str) -> list[list[int]]:
        if which not in self._reference:
            ids = self.builtin_ids if which == "builtin" else self.val_ids
            progress(f"  PyTorch greedy reference on {len(ids)} {which} sentences")
            self._reference[which] = self.source.reference.greedy(
                ids, default_limits(ids, self.source.max_target_len)
            )
        return self._reference[which]

    def fp32_dir(self) -> tuple[Path, dict[str, int]]:
        if self._fp32 is None:
            directory = self.work / "fp32"
            progress("  tracing the fp32 encoder/decoder graphs and optimising")
            self._fp32 = directory, build_fp32(self.source, directory)
        return self._fp32

    def bleu_fp32(self) -> BleuResult | None:
        if self._bleu_fp32 is None and self.eval_dir is not None:
            progress(f"  sacreBLEU of fp32 on {TEST_SPLIT} (beam {EVAL_BEAM})")
            self._bleu_fp32 = eval_bleu(OrtTranslator(self.fp32_dir()[0]), self.source, self.eval_dir)
        return self._bleu_fp32

    def build(self, variant: str, directory: Path) -> tuple[dict[str, float], dict[str, int]]:
        """Graphs of ``variant`` in ``directory``, verified; returns (parity, fusions)."""
        if variant == "fp32":
            fp32, fusions = self.fp32_dir()
            for name in ("encoder.onnx", "decoder.onnx"):
                shutil.copyfile(fp32 / name, directory / name)
        elif variant == "int8":
            progress("  quantising to int8 (dynamic)")
            fusions = _merge_fusions(self.fp32_dir()[1], build_int8(self.fp32_dir()[0], directory))
        else:
            progress("  tracing the fp16 graphs and optimising")
            fusions = build_fp16(self.source, directory)
        write_tokenizer(self.source, directory)
        return self.verify(variant, directory), fusions

    def verify(self, variant: str, directory: Path) -> dict[str, float]:
        self.check_tokenizer()
        try:
            translator = OrtTranslator(directory)
        except Exception as e:  # fp16 kernels the CPU provider lacks: nothing more to verify here
            if variant != "fp16":
                raise
            progress(f"  fp16 graphs do not run on the CPU provider ({e}); recorded as unverified")
            return {"cpu_verified": 0.0}
        progress(f"  {variant}: parity against PyTorch fp32")
        figures = parity(translator, self.source, self.reference_greedy("builtin")).as_parity()
        if variant == "fp16":  # verified on CPU, where part of the graph runs in float32 (see below)
            figures |= {"cpu_verified": 1.0, "cpu_fp16_inserted_casts": cpu_fp16_casts(directory, self.work)}
        if variant == "fp32":
            figures |= self.verify_fp32(translator, figures)
        else:
            figures |= self.verify_reduced(variant, translator)
        return figures

    def verify_fp32(self, translator: OrtTranslator, figures: dict[str, float]) -> dict[str, float]:
        worst = max(figures.values())
        if worst > FP32_TOLERANCE:
            raise VerificationError(
                f"fp32 graphs differ from PyTorch by {worst:.3g} > {FP32_TOLERANCE}: {figures}"
            )
        out: dict[str, float] = {}
        for which in ("builtin", "val"):
            ids = self.builtin_ids if which == "builtin" else self.val_ids
            if not ids:
                continue
            progress(f"  fp32: ONNX greedy vs PyTorch greedy on {len(ids)} {which} sentences")
            check = check_greedy(translator, self.source, ids, self.reference_greedy(which))
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

    def verify_reduced(self, variant: str, translator: OrtTranslator) -> dict[str, float]:
        out = {
            "greedy_builtin_agreement": greedy_agreement(
                translator, self.source, self.builtin_ids, self.reference_greedy("builtin")
            )
        }
        if self.val_ids:
            out["greedy_val_agreement"] = greedy_agreement(
                translator, self.source, self.val_ids, self.reference_greedy("val")
            )
        base = self.bleu_fp32()
        if base is None or self.eval_dir is None:
            return out
        progress(f"  sacreBLEU of {variant} on {TEST_SPLIT} (beam {EVAL_BEAM})")
        bleu = eval_bleu(translator, self.source, self.eval_dir)
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
    source: Path, out_root: Path, variants: list[str], eval_dir: Path | None = None, name: str | None = None
) -> list[Path]:
    """Export ``source`` (a checkpoint of ours or a Marian directory) to
    ``<out_root>/<name>/<variant>/`` for each variant (``["all"]``: every one); returns those
    directories. ``name`` overrides the artefact name (default: the checkpoint directory's).

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
    todo = [v for v in variants if not up_to_date(root / v, src, sha, v)]
    for v in variants:
        if v not in todo:
            progress(f"{src.name}/{v}: up to date (source sha256 {sha[:12]}…), skipped")
    if not todo:
        return targets
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="translation-export-") as work:
        exporter = _Exporter(src, sha, eval_dir, Path(work))
        for variant in todo:
            _export_variant(exporter, variant, root)
    return targets


def _export_variant(exporter: _Exporter, variant: str, root: Path) -> None:
    start = time.perf_counter()
    progress(f"{exporter.source.name}/{variant}: exporting")
    staging = root / f".{variant}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        parity_figures, fusions = exporter.build(variant, staging)
        write_manifest(
            staging, build_manifest(exporter.source, variant, staging, exporter.sha, parity_figures, fusions)
        )
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
    progress(f"{exporter.source.name}/{variant}: done in {time.perf_counter() - start:.0f}s → {target}")
