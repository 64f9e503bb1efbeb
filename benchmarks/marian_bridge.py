"""Our checkpoint as a Hugging Face ``MarianMTModel`` and as a CTranslate2 model: same weights.

The architectures coincide (post-LN encoder-decoder, ReLU FFN, sinusoidal positions, embeddings
scaled by √d_model and tied three ways). Two differences are bridged exactly:

* **Positional layout.** Ours interleaves ``[sin f0, cos f0, sin f1, cos f1, …]``; Marian puts
  ``[sin f0 … sin f_{d/2-1} | cos f0 … cos f_{d/2-1}]``, with the same frequencies. Rather than
  overwrite Marian's table (it is rebuilt from its formula on every load), we permute the
  model's hidden coordinates: every hidden vector ``h`` becomes ``h[:, perm]``. Embedding columns,
  the input columns of every linear layer reading the residual stream, the output rows of every
  layer writing it, and the LayerNorm parameters are permuted alike; LayerNorm, ReLU and
  attention are equivariant under it, and the tied output projection ``h Eᵀ`` is unchanged.
  The result is a plain Marian model that saves, reloads and converts like any other.
* **Decoder start.** We start decoding from ``<s>`` (id 1); Marian starts from ``<pad>`` (and
  CTranslate2's Marian loader from a zero embedding). The config says
  ``decoder_start_token_id = bos`` and the CTranslate2 spec starts from ``<s>``'s embedding.

``python -m benchmarks.marian_bridge CHECKPOINT`` checks that the logits agree.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.model import Transformer, TransformerConfig


def hidden_permutation(d_model: int) -> Tensor:
    """Index map from our hidden layout to Marian's: h_marian = h_ours[:, perm]."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(cfg: TransformerConfig):  # -> MarianConfig
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=cfg.vocab_size,
        decoder_vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        max_position_embeddings=cfg.max_len,
        activation_function="relu",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=cfg.pad_id,
        bos_token_id=cfg.bos_id,
        eos_token_id=cfg.eos_id,
        decoder_start_token_id=cfg.bos_id,  # ours starts from <s>, Marian's default is <pad>
        forced_eos_token_id=None,
    )


@torch.no_grad()
def to_marian(model: Transformer):  # -> MarianMTModel
    """A MarianMTModel computing the same function as ``model`` (see the module docstring)."""
    from transformers import MarianMTModel

    cfg = model.cfg
    perm = hidden_permutation(cfg.d_model)
    marian = MarianMTModel(marian_config(cfg)).eval()

    def reads(dst: torch.nn.Linear, src: torch.nn.Linear) -> None:  # input is the residual stream
        dst.weight.copy_(src.weight[:, perm])
        dst.bias.copy_(src.bias)

    def writes(dst: torch.nn.Linear, src: torch.nn.Linear) -> None:  # output is the residual stream
        dst.weight.copy_(src.weight[perm, :])
        dst.bias.copy_(src.bias[perm])

    def norm(dst: torch.nn.LayerNorm, src: torch.nn.LayerNorm) -> None:
        dst.weight.copy_(src.weight[perm])
        dst.bias.copy_(src.bias[perm])

    def attention(dst, src) -> None:  # type: ignore[no-untyped-def]
        reads(dst.q_proj, src.w_q)
        reads(dst.k_proj, src.w_k)
        reads(dst.v_proj, src.w_v)
        writes(dst.out_proj, src.w_o)

    marian.model.shared.weight.copy_(model.embed.weight[:, perm])
    for dst, src in zip(marian.model.encoder.layers, model.encoder, strict=True):
        attention(dst.self_attn, src.self_attn)
        norm(dst.self_attn_layer_norm, src.norm1)
        reads(dst.fc1, src.ffn.w_1)
        writes(dst.fc2, src.ffn.w_2)
        norm(dst.final_layer_norm, src.norm2)
    for dst, src in zip(marian.model.decoder.layers, model.decoder, strict=True):
        attention(dst.self_attn, src.self_attn)
        norm(dst.self_attn_layer_norm, src.norm1)
        attention(dst.encoder_attn, src.cross_attn)
        norm(dst.encoder_attn_layer_norm, src.norm2)
        reads(dst.fc1, src.ffn.w_1)
        writes(dst.fc2, src.ffn.w_2)
        norm(dst.final_layer_norm, src.norm3)
    marian.final_logits_bias.zero_()
    marian.tie_weights()
    assert marian.lm_head.weight.data_ptr() == marian.model.shared.weight.data_ptr(), "lm_head not tied"
    return marian


@torch.no_grad()
def max_logit_difference(model: Transformer, marian, src: Tensor, tgt_in: Tensor) -> float:  # type: ignore[no-untyped-def]
    """Largest |Δlogit| between the two models, teacher-forced on padded (B, S) / (B, T) ids."""
    ours = model(src, tgt_in)
    theirs = marian(
        input_ids=src,
        attention_mask=(src != model.cfg.pad_id).long(),
        decoder_input_ids=tgt_in,
        use_cache=False,
    ).logits
    return float((ours - theirs).abs().max())


def vocabulary(tokenizer_json: Path) -> list[str]:
    """The tokens of a ``tokenizers`` JSON file, in id order."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    size = tok.get_vocab_size(with_added_tokens=True)
    tokens = [tok.id_to_token(i) for i in range(size)]
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise ValueError(f"{tokenizer_json}: ids without a token: {missing[:5]}")
    return tokens  # type: ignore[return-value]


def ct2_spec(marian, tokens: Sequence[str], *, bos: str, eos: str, unk: str, start_token: str | None):  # type: ignore[no-untyped-def]
    """A CTranslate2 ``TransformerSpec`` of a MarianMTModel, built through the converter's loader.

    ``start_token=None`` keeps Marian's convention (decoder starts from a zero embedding);
    otherwise the decoder starts from that token's embedding, as ours does with ``<s>``. The
    loader's removal of a trailing ``<pad>`` row only applies to the Marian convention.
    """
    from ctranslate2.converters.transformers import BartLoader, MarianMTLoader

    marian.config.normalize_before = False
    marian.config.normalize_embedding = False
    if start_token is None:
        loader = MarianMTLoader()
        spec = loader.get_model_spec(marian)
        if tokens[-1] == "<pad>":
            tokens = list(tokens[:-1])
        spec.config.decoder_start_token = eos
    else:
        spec = BartLoader.get_model_spec(MarianMTLoader(), marian)  # no pad-row removal
        spec.decoder.start_from_zero_embedding = False
        spec.config.decoder_start_token = start_token
    spec.config.bos_token = bos
    spec.config.eos_token = eos
    spec.config.unk_token = unk
    spec.register_source_vocabulary(list(tokens))
    spec.register_target_vocabulary(list(tokens))
    return spec


def save_ct2(spec, out_dir: Path, quantization: str) -> Path:  # type: ignore[no-untyped-def]
    """Validate, quantize (``float32`` / ``int8`` …) and write a CTranslate2 model directory."""
    spec.validate()
    spec.optimize(quantization=quantization)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spec.save(str(out_dir))
    return out_dir


def convert_checkpoint(checkpoint: Path, tokenizer_json: Path, out_root: Path) -> dict[str, Path]:
    """Our checkpoint → ``out_root/{hf,ct2-float32,ct2-int8}``; returns those paths.

    The spec is rebuilt for each quantization because ``optimize`` changes it in place.
    """
    model = load_checkpoint(checkpoint)
    marian = to_marian(model)
    paths = {"hf": out_root / "hf"}
    marian.save_pretrained(paths["hf"])
    shutil.copy(tokenizer_json, paths["hf"] / "tokenizer.json")  # ours; for reference
    tokens = vocabulary(tokenizer_json)
    cfg = model.cfg
    special = {"bos": tokens[cfg.bos_id], "eos": tokens[cfg.eos_id], "unk": tokens[cfg.unk_id]}
    for quant in ("float32", "int8"):
        spec = ct2_spec(marian, tokens, start_token=special["bos"], **special)
        paths[f"ct2-{quant}"] = save_ct2(spec, out_root / f"ct2-{quant}", quant)
    return paths


def make_random_marian(
    out_dir: Path,
    corpus: Sequence[str],
    *,
    vocab_size: int = 19_000,
    d_model: int = 512,
    layers: int = 6,
    heads: int = 8,
    d_ff: int = 2048,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """A Marian-convention model directory with random weights, as an opus-mt one is laid out.

    The tokenizer is real: a joint unigram SentencePiece model trained on ``corpus`` (saved as
    source.spm and target.spm) with its pieces at ids 0..N-1 in vocab.json and ``<pad>``
    appended last, ``pad = decoder start``, ``</s>`` = 0, ``bad_words_ids = [[pad]]``: what both
    CTranslate2's converter and our Marian import expect. Cached: an existing dir is reused.
    """
    import sentencepiece as spm
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "_spm"
    work.mkdir(exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_prefix=str(work / "joint"),
        vocab_size=vocab_size,
        model_type="unigram",
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=-1,
        hard_vocab_limit=False,
        character_coverage=1.0,
        num_threads=2,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(work / "joint.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {p: i for i, p in enumerate(pieces)}
    vocab["<pad>"] = len(pieces)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(
        str(work / "joint.model"),
        str(work / "joint.model"),
        str(work / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        max_position_embeddings=max_positions,
        activation_function="relu",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        bad_words_ids=[[pad]],
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    model.generation_config = GenerationConfig(
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        bad_words_ids=[[pad]],
        forced_eos_token_id=0,
        max_length=max_positions,
        num_beams=4,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    shutil.rmtree(work)
    return out_dir


def convert_marian_dir(marian_dir: Path, out_dir: Path, quantization: str, vmap: Path | None = None) -> Path:
    """CTranslate2's own Transformers converter on a Marian-convention directory (the recipe),
    with a vocabulary map when given (used with ``translate_batch(use_vmap=True)``)."""
    from ctranslate2.converters import TransformersConverter

    if (out_dir / "model.bin").is_file():
        return out_dir
    TransformersConverter(str(marian_dir)).convert(
        str(out_dir), vmap=None if vmap is None else str(vmap), quantization=quantization, force=True
    )
    return out_dir


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.marian_bridge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--tokenizer", type=Path, help="default: tokenizer.json next to the checkpoint")
    p.add_argument("--out", type=Path, help="also write the HF and CTranslate2 models here")
    args = p.parse_args(argv)
    from tokenizers import Tokenizer

    from export.sources.ours.data import encode_source, encode_target, pad

    tok_path = args.tokenizer or args.checkpoint.parent / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    model = load_checkpoint(args.checkpoint)
    marian = to_marian(model)
    texts = ["A man is riding a bike.", "Two dogs play in the snow near a red house."]
    refs = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    src = pad(encode_source(tok, texts, model.cfg.max_len), model.cfg.pad_id)
    tgt = pad(encode_target(tok, refs, model.cfg.max_len), model.cfg.pad_id)[:, :-1]
    diff = max_logit_difference(model, marian, src, tgt)
    print(json.dumps({"max_abs_logit_difference": diff}))
    if args.out:
        print(
            json.dumps(
                {k: str(v) for k, v in convert_checkpoint(args.checkpoint, tok_path, args.out).items()}
            )
        )


if __name__ == "__main__":
    main()
