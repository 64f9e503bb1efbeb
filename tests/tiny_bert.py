"""What the tiny random BERT models of the embedding and rerank tests share: their sizes and an
uncased WordPiece tokenizer laid out as a published BERT directory's (tokenizer.json with BERT's
pair template, vocab.txt, tokenizer_config.json).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?;:'-()%/")
# BertConfig's sizes: 2 layers, hidden 32, 2 heads; a larger initializer_range than BERT's 0.02
# gives outputs that depend on the input
TINY_BERT_SIZES: dict[str, int | float] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "initializer_range": 0.3,
}


def write_wordpiece_tokenizer(
    directory: Path,
    words: Sequence[str],
    pieces: Sequence[str],
    *,
    model_max_length: int,
    truncation: int,
    padding: int | None = None,
) -> int:
    """The tokenizer files over the specials, ``words``, ``pieces`` and single characters, in that
    order of ids; ``truncation`` and ``padding`` (a length) are set in tokenizer.json itself, as
    published files set them. → the vocabulary's size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIALS, *words, *pieces, *CHARS]))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    if padding is not None:
        tokenizer.enable_padding(pad_id=vocab["[PAD]"], pad_token="[PAD]", length=padding)
    tokenizer.enable_truncation(truncation)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "model_max_length": model_max_length,
        **dict(zip(names, SPECIALS, strict=True)),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return len(vocab)
