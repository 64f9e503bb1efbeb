"""Tiny real models for tests that need artefacts: built in seconds, exported by the export code.

* ``tiny_translation_checkpoint``: our Transformer (d_model 32), trained for a few dozen steps to
  reverse word order, so that greedy and beam outputs vary in length and end with </s> (a random
  model repeats one token to the limit, which would leave finishing and reordering untested).
* ``tiny_bert_dir``: a random BertModel in the sentence-transformers layout (mean pooling) with a
  small WordPiece ``tokenizer.json``.

They import torch/transformers (the export world); callers in the service tests skip without them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "a",
    "man",
    "rides",
    "bike",
    "two",
    "dogs",
    "run",
    "small",
    "cat",
    "sits",
    "on",
    "the",
    "big",
    "red",
    "street",
]
REVERSE_STEPS = 40
# The sizes of the tiny BART-family models (Marian, M2M-100) the import tests build.
TINY_BART_SIZES: dict[str, int] = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}


def reversal_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    sources = [" ".join(rng.sample(WORDS, rng.randint(1, 6))) for _ in range(n)]
    return sources, [" ".join(reversed(s.split())) for s in sources]


def few_reference_sentences(path: Path, n: int = 6) -> Path:
    """``n`` sentences of WORDS in a file for ``export_translation(reference=path)``: the export's
    own checks (alone vs batched, beams 1 and 4) on a few sentences instead of the committed 200+,
    for a test that checks something else of the export (seconds instead of a minute)."""
    path.write_text("\n".join(reversal_pairs(n, seed=3)[0]) + "\n", encoding="utf-8")
    return path


def tiny_translation_checkpoint(
    directory: Path, max_len: int = 40, seed: int = 0, vocab_size: int = 80, **config: int
) -> Path:
    """``directory/model.safetensors`` + ``tokenizer.json`` (a checkpoint of ours); returns directory.

    The directory's name becomes the artefact name (e.g. ``tiny-en-de``); ``config`` overrides
    the TransformerConfig's sizes (d_model, n_heads, n_encoder_layers, ...).
    """
    import torch
    import torch.nn.functional as F

    from export.sources.ours.checkpoint import save_checkpoint
    from export.sources.ours.data import encode_source, encode_target, pad, train_tokenizer
    from export.sources.ours.model import Transformer, TransformerConfig

    corpus = [" ".join(WORDS[i:] + WORDS[:i]) + "." for i in range(len(WORDS))] * 3
    tok = train_tokenizer(corpus, vocab_size=vocab_size)
    torch.manual_seed(seed)
    sizes = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 2} | config
    cfg = TransformerConfig(vocab_size=tok.get_vocab_size(), max_len=max_len, dropout=0.0, **sizes)
    model = Transformer(cfg)
    sources, targets = reversal_pairs(64, seed)
    src = pad(encode_source(tok, sources, max_len), cfg.pad_id)
    tgt = pad(encode_target(tok, targets, max_len), cfg.pad_id)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(REVERSE_STEPS):
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, cfg.vocab_size), tgt[:, 1:].reshape(-1), ignore_index=cfg.pad_id
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    directory.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model.eval(), directory / "model.safetensors")
    tok.save(str(directory / "tokenizer.json"))
    return directory


def identity_vmap(tokenizer: Path, out: Path) -> Path:
    """A vocabulary map (CTranslate2's vmap format) in which every word piece allows itself: right
    for a model that reverses its input."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab()
    out.write_text("".join(f"{t}\t{t}\n" for t in sorted(vocab) if not t.startswith("<")), encoding="utf-8")
    return out


BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing", ".", ",", "!", "?"]


def tiny_bert_dir(directory: Path, max_len: int = 16, seed: int = 0) -> Path:
    """A random 2-layer BertModel saved in the sentence-transformers layout; returns directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(BERT_VOCAB)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.add_special_tokens(BERT_VOCAB[:5])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n", encoding="utf-8")

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(BERT_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_len + 8,
    )
    BertModel(cfg).eval().save_pretrained(str(directory))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": True,
            "model_max_length": max_len,
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "mask_token": "[MASK]",
        },
    )
    _write_json(
        directory / "special_tokens_map.json",
        {
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "mask_token": "[MASK]",
        },
    )
    _write_json(
        directory / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    _write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_len, "do_lower_case": False})
    _write_json(
        directory / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": 32,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (directory / "2_Normalize").mkdir(exist_ok=True)
    return directory


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


M2M100_LANGUAGES = ["en", "de", "fr"]


def tiny_m2m100_dir(
    directory: Path,
    src_lang: str = "en",
    tgt_lang: str = "de",
    seed: int = 0,
    generation: dict[str, object] | None = None,
) -> Path:
    """A random M2M100ForConditionalGeneration (M2M-100's layout: <s> 0, <pad> 1, </s> 2, <unk> 3,
    words, then the ``__xx__`` language tokens) with a word-level ``tokenizer.json`` and a
    tokenizer_config.json naming the pair; ``generation`` sets its generation config's fields."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for token in [*WORDS, ".", *(f"__{code}__" for code in M2M100_LANGUAGES)]:
        vocab.setdefault(token, len(vocab))
    directory.mkdir(parents=True)
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", *(f"__{c}__" for c in M2M100_LANGUAGES)])
    tok.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", {"src_lang": src_lang, "tgt_lang": tgt_lang})
    _save_random_m2m100(directory, len(vocab), seed, generation or {})
    return directory


def _save_random_m2m100(
    directory: Path, vocab_size: int, seed: int, generation: dict[str, object], eos_scale: float = 1.0
) -> None:
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    cfg = M2M100Config(
        vocab_size=vocab_size,
        **TINY_BART_SIZES,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        scale_embedding=True,
        activation_function="relu",
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # pre-LN layers need larger weights for outputs that depend on the source
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.35)
        model.lm_head.weight[cfg.eos_token_id] *= eos_scale
    for name, value in generation.items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(str(directory))


NLLB_LANGUAGES = ["eng_Latn", "deu_Latn", "fra_Latn"]


def tiny_nllb_dir(
    directory: Path,
    src_lang: str = "eng_Latn",
    tgt_lang: str = "deu_Latn",
    seed: int = 0,
    legacy_behaviour: bool = False,
    generation: dict[str, object] | None = None,
) -> Path:
    """A random M2M100ForConditionalGeneration with NLLB-200's tokenizer files: a SentencePiece
    BPE model (``sentencepiece.bpe.model``, trained here offline on sentences of WORDS), the
    ``tokenizer.json`` transformers' NllbTokenizer converts it to, and a tokenizer_config.json
    naming the pair and ``legacy_behaviour`` (the source-language token last, after </s>).
    Remove tokenizer.json for a directory that has only the SentencePiece model."""
    import io

    import sentencepiece as spm
    from transformers import AutoTokenizer

    directory.mkdir(parents=True)
    rng = random.Random(seed)
    sentences = [" ".join(rng.sample(WORDS, rng.randint(1, 6))) for _ in range(200)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=60,
        model_type="bpe",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (directory / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "NllbTokenizer",
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "legacy_behaviour": legacy_behaviour,
        "additional_special_tokens": NLLB_LANGUAGES,
    }
    _write_json(directory / "tokenizer_config.json", config)
    tok = AutoTokenizer.from_pretrained(str(directory))  # converts the SentencePiece model
    tok.save_pretrained(str(directory))
    # </s> made likelier: at random weights over pieces this small, hypotheses would rarely end
    _save_random_m2m100(directory, len(tok), seed, generation or {}, eos_scale=3.0)
    return directory
