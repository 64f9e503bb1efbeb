"""Cross-encoder (reranker) sources: a local Hugging Face ``…ForSequenceClassification`` directory
of the BERT family with one label, e.g. the cross-encoder/ms-marco-MiniLM models or BAAI's
bge-reranker (XLM-RoBERTa).

The encoder's facts (model type, sizes, maximum length, weight files, whether token type ids
exist) are read as for embeddings (export/sources/bert.py: JSON only, no torch); what is a
cross-encoder's own is read here: the ``…ForSequenceClassification`` architecture and its single
label. A query and a document go in as one pair, tokenised by the model's own tokenizer
(``[CLS] query [SEP] document [SEP]``, token type 1 on the document for BERT), truncated
longest-first as Hugging Face's tokenizers (``truncation=True``), sentence-transformers'
CrossEncoder and TEI do. :func:`logits_module` is the graph the export traces: the model with
exactly the I/O of the artefact's ``reranker.onnx`` (``service.artefacts.RERANK_OUTPUT``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from export.sources.bert import EmbeddingSource, called_by_position, inspect_source, source_tokenizer
from service.artefacts import RerankInfo

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

CLASSIFIER_SUFFIX = "ForSequenceClassification"


@dataclass(frozen=True)
class CrossEncoderSource:
    """What the export needs to know about a cross-encoder directory, read from its JSON files."""

    encoder: EmbeddingSource  # the shared facts of a BERT-family directory
    architecture: str  # e.g. "BertForSequenceClassification"

    @property
    def directory(self) -> Path:
        return self.encoder.directory

    @property
    def input_names(self) -> list[str]:
        return self.encoder.input_names

    def info(self) -> RerankInfo:
        return RerankInfo(
            max_len=self.encoder.max_len, needs_token_type_ids=self.encoder.needs_token_type_ids
        )


def classifier_architecture(config: dict[str, object]) -> str | None:
    """The ``…ForSequenceClassification`` class config.json names, if any (also what the command
    line detects a reranker by)."""
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return None
    return next((str(a) for a in architectures if str(a).endswith(CLASSIFIER_SUFFIX)), None)


def _labels(config: dict[str, object]) -> int:
    """The classifier's outputs: config.json's ``id2label`` entries (what transformers reads),
    else ``num_labels``, else transformers' default of 2."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    labels = config.get("num_labels")
    return int(labels) if isinstance(labels, int) else 2


def inspect_cross_encoder(directory: Path) -> CrossEncoderSource:
    """Read the source without torch; ValueError for what cannot be served as a reranker."""
    directory = Path(directory)
    encoder = inspect_source(directory)  # the model type, config.json and weights checked there
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    architecture = classifier_architecture(config)
    if architecture is None:
        raise ValueError(
            f"{directory}: config.json names no …{CLASSIFIER_SUFFIX} architecture "
            f"({config.get('architectures')}): not a cross-encoder"
        )
    labels = _labels(config)
    if labels != 1:
        raise ValueError(
            f"{directory}: {architecture} has {labels} labels; a reranker scores a pair with one "
            "(a classifier of several labels, e.g. NLI, is not a reranker)"
        )
    return CrossEncoderSource(encoder=encoder, architecture=architecture)


def pair_tokenizer(source: CrossEncoderSource) -> Tokenizer:
    """The source's fast tokenizer for pairs: padding off (the service pads its own batches),
    truncation longest-first at the maximum length (the served copy must cut as the source's
    pipeline does, whatever tokenizer.json says)."""
    tokenizer = source_tokenizer(source.directory)
    tokenizer.enable_truncation(max_length=source.encoder.max_len, strategy="longest_first")
    return tokenizer


def logits_module(source: CrossEncoderSource) -> torch.nn.Module:
    """The model (eager attention: the pattern onnxruntime's optimizer fuses) as a module whose
    positional inputs are ``source.input_names`` and whose output is the classifier's logits
    (batch, 1): the sigmoid, when asked for, is the service's (NumPy)."""
    from transformers import AutoModelForSequenceClassification

    model = (
        AutoModelForSequenceClassification.from_pretrained(str(source.directory), attn_implementation="eager")
        .float()
        .eval()
    )
    return called_by_position(model, source.input_names, "logits")
