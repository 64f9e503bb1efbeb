"""A tiny real cross-encoder for the rerank tests: a random 2-layer ``BertForSequenceClassification``
with one label (the cross-encoder/ms-marco-MiniLM layout: config.json, weights, tokenizer.json
with BERT's pair template, tokenizer_config.json), built in a second, and its exported artefact.

It imports torch/transformers (the export world); callers in the service tests skip without them.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_bert import TINY_BERT_SIZES, write_wordpiece_tokenizer

_WORDS_TEXT = (
    "a an the man woman child dog dogs cat is are playing plays guitar piano ball red field snow "
    "running through on in at with of and to quick brown fox jumps over lazy sleeps movie new market "
    "stock fell what where who how does do capital city paris france berlin germany weather today"
)
WORDS = _WORDS_TEXT.split()
PIECES = ["##s", "##ing", "##ed", "##y", *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]]
MAX_LEN = 32  # tokens of a pair: the long check sentence is cut


def tiny_cross_encoder_dir(directory: Path, *, num_labels: int = 1, seed: int = 0) -> Path:
    """A random BertForSequenceClassification (hidden 32, 2 heads, ``num_labels``); returns directory."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    # like the published files, truncated at 512 in tokenizer.json: the export sets its own
    vocab_size = write_wordpiece_tokenizer(directory, WORDS, PIECES, model_max_length=MAX_LEN, truncation=512)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, num_labels=num_labels, **TINY_BERT_SIZES)
    BertForSequenceClassification(config).eval().save_pretrained(str(directory))
    return directory


def tiny_rerank_artefact(out_root: Path, name: str = "tiny-rerank", variant: str = "fp32") -> Path:
    """The tiny cross-encoder exported (and verified) by the export code; returns its directory."""
    from export.rerank import export_rerank

    source = tiny_cross_encoder_dir(out_root / "sources" / name)
    (directory,) = export_rerank(source, out_root, [variant], name=name)
    return directory
