"""Stage ``nllb``: NLLB-200-distilled-600M's shape (random weights) in CTranslate2 int8 and our
engine int8 (issue 45's benchmark), Hugging Face generate fp32 as the baseline in full runs.

The model is an ``M2M100ForConditionalGeneration`` with NLLB-200-distilled-600M's published
configuration (d_model 1024, 12+12 pre-LN layers, 16 heads, FFN 4096, ReLU, scaled embeddings,
1024 positions, ``</s>`` as decoder start, a vocabulary of 256,206 rows shared by the encoder, the
decoder and the output projection) and random weights. The machine has no access to the Hub, so
the tokenizer is built here in NLLB's exact id layout: ``<s> <pad> </s> <unk>`` at 0–3, a
SentencePiece BPE trained on Multi30k ``train`` (English and German, 16,000 pieces) padded with
unused filler pieces to NLLB's 256,000, the 202 language codes at 256,001–256,202, ``<mask>`` at
256,203; the model's last two rows, past the tokenizer as in NLLB, are zero so that no system
ever picks them. Sources are real captions tokenized like text, outputs random pieces (mostly
fillers), each forced to 20 tokens: the target language's ``deu_Latn`` first (transformers'
``forced_bos_token_id``, CTranslate2's ``target_prefix``, our engine's forced first token), then
19 with ``</s>`` suppressed, so every system does the same work at every step.

Beam 4, batches of 32, in-process. The quick run leaves Hugging Face out (a 600M-parameter model
in fp32 on two cores would take longer than the rest of the stage) and measures one batch.
"""

from __future__ import annotations

import gc
import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import translators as tr
from benchmarks.harness import Bench, Need, Stage
from benchmarks.translation import BEAM4_BATCH32_FORCED, OURS_INT8, run_suite
from benchmarks.translators import CT2_INT8, CT2_INT8_REPLICAS, TextCodec, Translator

SOURCE_LANGUAGE, TARGET_LANGUAGE = "eng_Latn", "deu_Latn"
PAD, EOS = 1, 2  # NLLB's ids: <s> 0, <pad> 1, </s> 2 (also the decoder start), <unk> 3


@dataclass(frozen=True)
class NllbShape:
    name: str  # the model directory's name under the cache, also our artefact's
    d_model: int
    layers: int  # encoder and decoder each
    heads: int
    ffn: int
    max_positions: int
    trained_pieces: int  # the BPE trained on Multi30k (fewer when the corpus has fewer)
    pieces: int  # SentencePiece pieces, fillers included; the language codes follow them
    rows_past_tokenizer: int  # the model's vocabulary rows beyond the tokenizer's


NLLB_600M = NllbShape("nllb-200-600m-shape-random", 1024, 12, 16, 4096, 1024, 16_000, 256_000, 2)


def nllb_language_codes() -> list[str]:
    from service.languages_nllb import NLLB_200

    return list(NLLB_200)


def make_random_nllb(
    out_dir: Path, corpus: Sequence[str], shape: NllbShape = NLLB_600M, seed: int = 0
) -> Path:
    """An NLLB-layout model directory (config.json, generation_config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json naming eng_Latn → deu_Latn) with random weights, as the
    module docstring describes. Cached: an existing directory is reused."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    n_tokens = write_nllb_tokenizer(out_dir, corpus, shape.trained_pieces, shape.pieces)
    config = M2M100Config(
        vocab_size=n_tokens + shape.rows_past_tokenizer,
        d_model=shape.d_model,
        encoder_layers=shape.layers,
        decoder_layers=shape.layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn,
        decoder_ffn_dim=shape.ffn,
        max_position_embeddings=shape.max_positions,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
    )
    config.tokenizer_class = "NllbTokenizer"  # as NLLB's config.json names it
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():  # tied: the output projection's rows too
        model.model.shared.weight[n_tokens:] = 0.0
    model.generation_config = GenerationConfig(
        bos_token_id=0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=EOS, max_length=200
    )
    model.save_pretrained(out_dir)
    return out_dir


def write_nllb_tokenizer(directory: Path, corpus: Sequence[str], trained_pieces: int, pieces: int) -> int:
    """tokenizer.json and tokenizer_config.json in NLLB's id layout (the module docstring):
    transformers' NllbTokenizer converted from a SentencePiece BPE trained on ``corpus``, its
    vocabulary padded with ``<fillerN>`` pieces to ``pieces`` and its special tokens renumbered
    as NLLB numbers them; → the number of tokens."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    codes = nllb_language_codes()
    config = {
        "tokenizer_class": "NllbTokenizer",
        "src_lang": SOURCE_LANGUAGE,
        "tgt_lang": TARGET_LANGUAGE,
        "legacy_behaviour": False,
        "additional_special_tokens": codes,
    }
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        vocab_size=trained_pieces,
        model_type="bpe",
        hard_vocab_limit=False,
        character_coverage=1.0,
        num_threads=2,
        minloglevel=2,
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(model.getvalue())
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        converted = json.loads(AutoTokenizer.from_pretrained(tmp).backend_tokenizer.to_str())
    vocab: dict[str, int] = converted["model"]["vocab"]  # fairseq's: 4 specials, then the pieces
    if len(vocab) > pieces + 1:
        raise ValueError(f"the trained BPE has {len(vocab) - 4} pieces, more than {pieces}")
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), pieces + 1)})
    ids = {"<s>": 0, "<pad>": PAD, "</s>": EOS, "<unk>": 3}
    ids |= {code: pieces + 1 + i for i, code in enumerate(codes)} | {"<mask>": pieces + 1 + len(codes)}
    for token in converted["added_tokens"]:
        token["id"] = ids[token["content"]]
    converted["added_tokens"].sort(key=lambda token: token["id"])
    converted["post_processor"] = None  # it names the old ids; the NllbTokenizer writes it anew
    Tokenizer.from_str(json.dumps(converted)).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(directory))
    tok.save_pretrained(str(directory))  # tokenizer.json with the source language's template
    if len(tok) != ids["<mask>"] + 1 or tok.convert_tokens_to_ids(TARGET_LANGUAGE) != ids[TARGET_LANGUAGE]:
        raise RuntimeError(f"{directory}: the tokenizer lost NLLB's layout when transformers loaded it")
    return len(tok)


def run(bench: Bench) -> None:
    from tokenizers import Tokenizer
    from transformers import M2M100Config

    if bench.nllb is None:  # its preparation failed, with a note
        return
    paths = bench.nllb
    cfg = M2M100Config.from_pretrained(paths["hf"])
    # NllbTokenizer's own file: eng_Latn first, </s> last, the input our export's tokenizer gives
    tokenizer = Tokenizer.from_file(str(paths["hf"] / "tokenizer.json"))
    codec = TextCodec(tokenizer, eos_id=EOS, pad_id=PAD)
    target = tokenizer.token_to_id(TARGET_LANGUAGE)
    systems: list[Translator] = []
    if not bench.quick:
        systems += [tr.HFGenerate(paths["hf"], codec, bench.threads, forced_first=target)]
    ct2 = paths["ct2-int8"]
    systems.append(tr.CTranslate2(ct2, codec, bench.threads, CT2_INT8, target_prefix=TARGET_LANGUAGE))
    systems.append(
        tr.CTranslate2(ct2, codec, bench.threads, CT2_INT8_REPLICAS, True, target_prefix=TARGET_LANGUAGE)
    )
    if "nllb/int8" in bench.models:
        systems += bench.system(tr.OursInProcess, bench.models["nllb/int8"], bench.threads, OURS_INT8)
    else:
        bench.results.note("nllb: no int8 export of ours, CTranslate2 measured alone")
    # quick: one batch (CTranslate2 int8 took ~12 s for it on two busy cores), a few minutes in all
    n = 32 if bench.quick else 128
    src, _ = bench.test_set(n)
    print(f"== translation: random NLLB-200-layout model {paths['hf'].name}", flush=True)
    run_suite(
        bench.results,
        f"random NLLB-200-layout model (d{cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers}, "
        f"vocab {cfg.vocab_size}), {SOURCE_LANGUAGE}→{TARGET_LANGUAGE}",
        systems,
        src,
        None,
        codec,
        [(BEAM4_BATCH32_FORCED, n)],
        rounds=bench.rounds,
    )
    del systems
    gc.collect()


STAGE = Stage("nllb", "NLLB-200 600M shape", frozenset({Need.NLLB}), run)
