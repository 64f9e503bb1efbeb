"""A tiny real cross-encoder for the rerank tests: a random 2-layer ``BertForSequenceClassification``
with one label (the cross-encoder/ms-marco-MiniLM layout: config.json, weights, tokenizer.json
with BERT's pair template, tokenizer_config.json), built in a second, and its exported artefact.

It imports torch/transformers (the export world); callers in the service tests skip without them.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS_TEXT = (
    "a an the man woman child dog dogs cat is are playing plays guitar piano ball red field snow "
    "running through on in at with of and to quick brown fox jumps over lazy sleeps movie new market "
    "stock fell what where who how does do capital city paris france berlin germany weather today"
)
WORDS = _WORDS_TEXT.split()
PIECES = ["##s", "##ing", "##ed", "##y", *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?;:'-()%/")
MAX_LEN = 32  # tokens of a pair: the long check sentence is cut


def _write_tokenizer(directory: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIALS, *WORDS, *PIECES, *CHARS]))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.enable_truncation(512)  # like the published files: the export sets its own
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "model_max_length": MAX_LEN,
        **dict(zip(names, SPECIALS, strict=True)),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return len(vocab)


def tiny_cross_encoder_dir(directory: Path, *, num_labels: int = 1, seed: int = 0) -> Path:
    """A random BertForSequenceClassification (hidden 32, 2 heads, ``num_labels``); returns directory."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(directory)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
        initializer_range=0.3,  # larger than BERT's 0.02: logits that depend on the pair
    )
    BertForSequenceClassification(config).eval().save_pretrained(str(directory))
    return directory


def tiny_rerank_artefact(out_root: Path, name: str = "tiny-rerank", variant: str = "fp32") -> Path:
    """The tiny cross-encoder exported (and verified) by the export code; returns its directory."""
    from export.rerank import export_rerank

    source = tiny_cross_encoder_dir(out_root / "sources" / name)
    (directory,) = export_rerank(source, out_root, [variant], name=name)
    return directory
