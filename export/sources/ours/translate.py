"""Translate with a PyTorch checkpoint: the reference the ONNX artefacts must match.

python -m export.sources.ours.translate "A man is riding a bike." --beam 4
python -m export.sources.ours.translate --input test.en --beam 4 > hyp.de

``translate_ids`` and ``translate`` also take several models of one vocabulary: an ensemble whose
every step averages the models' probabilities (``EnsembleDecoder``), for evaluation and for
distillation data (export/training/distill.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from export.sources import generation_length_penalty
from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import encode_source, length_sorted_batches, output_limits, pad
from export.sources.ours.model import KeyValue, Transformer, padding_mask
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import TokenHypothesis

DEFAULT_CHECKPOINT = Path(__file__).parents[2] / "checkpoints" / "transformer-en-de" / "model.safetensors"


class TorchDecoder:
    """The model's cached decoder behind the search's ``IncrementalDecoder`` protocol."""

    def __init__(self, model: Transformer, src: torch.Tensor, with_attention: bool = False) -> None:
        self.model = model
        self.memory_kv = model.memory_kv(model.encode(src))
        self.src_mask = padding_mask(src, model.cfg.pad_id)
        self.past: list[KeyValue] | None = None
        self.with_attention = with_attention

    @torch.no_grad()
    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        tokens = torch.from_numpy(last_tokens).to(self.src_mask.device)[:, None]  # (N, 1)
        logits, self.past, attn = self.model.decode(tokens, self.memory_kv, self.src_mask, self.past)
        logp = logits[:, -1].float().log_softmax(-1).cpu().numpy()
        return logp, attn[:, -1].float().cpu().numpy() if self.with_attention else None

    def reorder(self, rows: np.ndarray) -> None:
        idx = torch.from_numpy(rows).to(self.src_mask.device)
        self.memory_kv = [(k[idx], v[idx]) for k, v in self.memory_kv]
        self.src_mask = self.src_mask[idx]
        if self.past is not None:
            self.past = [(k[idx], v[idx]) for k, v in self.past]


class EnsembleDecoder:
    """Several models' cached decoders as one: log p = log(mean_i p_i) at every step (equal
    weights, as Marian's ensembles); the alignments are the first model's."""

    def __init__(self, decoders: Sequence[TorchDecoder]) -> None:
        self.decoders = list(decoders)
        self.log_n = float(np.log(len(self.decoders)))

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        outputs = [d.step(last_tokens) for d in self.decoders]
        logp = np.logaddexp.reduce(np.stack([lp for lp, _ in outputs]), axis=0) - self.log_n
        return logp.astype(np.float32), outputs[0][1]

    def reorder(self, rows: np.ndarray) -> None:
        for d in self.decoders:
            d.reorder(rows)


def ensemble_of(models: Transformer | Sequence[Transformer]) -> list[Transformer]:
    """The models as a list, checked to share a vocabulary and special ids (ValueError if not)."""
    members = [models] if isinstance(models, Transformer) else list(models)
    kinds = {(m.cfg.vocab_size, m.cfg.pad_id, m.cfg.bos_id, m.cfg.eos_id) for m in members}
    if len(kinds) != 1:
        raise ValueError("an ensemble's models must share one vocabulary and its special ids")
    return members


@torch.no_grad()
def translate_ids(
    model: Transformer | Sequence[Transformer],
    src_ids: Sequence[Sequence[int]],
    beam_size: int = 4,
    max_len: int | None = None,
    batch_size: int = 64,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Best hypothesis ids per source, batched in length order, returned in input order; with
    several models, their ensemble's."""
    models = ensemble_of(model)
    cfg = models[0].cfg
    device = next(models[0].parameters()).device
    out: list[list[int]] = [[] for _ in src_ids]
    for chunk in length_sorted_batches([len(s) for s in src_ids], batch_size):
        src = pad([src_ids[i] for i in chunk], cfg.pad_id).to(device)
        chunk_ids = [src_ids[i] for i in chunk]
        limits = [max_len] * len(chunk) if max_len else output_limits(chunk_ids, cfg.max_len)
        decoders = [TorchDecoder(m, src) for m in models]
        hyps: list[list[TokenHypothesis]] = beam_search(
            decoders[0] if len(decoders) == 1 else EnsembleDecoder(decoders),
            len(chunk),
            beam_size=beam_size,
            max_len=limits,
            bos_id=cfg.bos_id,
            eos_id=cfg.eos_id,
            length_penalty=length_penalty,
        )
        for i, h in zip(chunk, hyps, strict=True):
            out[i] = h[0].tokens
    return out


def translate(
    model: Transformer | Sequence[Transformer],
    tokenizer: Tokenizer,
    texts: Sequence[str],
    beam_size: int = 4,
    **kwargs: int | float,
) -> list[str]:
    models = ensemble_of(model)
    src_ids = encode_source(tokenizer, texts, models[0].cfg.max_len)
    ids = translate_ids(models, src_ids, beam_size=beam_size, **kwargs)  # type: ignore[arg-type]
    return tokenizer.decode_batch(ids)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m export.sources.ours.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", nargs="*", help="sentences to translate (else --input or stdin)")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--tokenizer", type=Path, help="default: tokenizer.json next to the checkpoint")
    p.add_argument("--input", type=Path, help="a file with one sentence per line")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument(
        "--length-penalty",
        type=float,
        help="score = log-prob / length ** penalty "
        "(default: the checkpoint's generation_config.json, else 1.0)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)

    model = load_checkpoint(args.checkpoint)
    tokenizer = Tokenizer.from_file(str(args.tokenizer or args.checkpoint.parent / "tokenizer.json"))
    if args.text:
        texts = list(args.text)
    elif args.input:
        texts = args.input.read_text(encoding="utf-8").splitlines()
    else:
        texts = sys.stdin.read().splitlines()
    for line in translate(
        model,
        tokenizer,
        texts,
        beam_size=args.beam,
        length_penalty=checkpoint_length_penalty(args.checkpoint, args.length_penalty),
        batch_size=args.batch_size,
    ):
        print(line)


def checkpoint_length_penalty(checkpoint: Path, given: float | None) -> float:
    """``given``, else the length penalty of the checkpoint's generation config."""
    return given if given is not None else generation_length_penalty(checkpoint.parent)


if __name__ == "__main__":
    main()
