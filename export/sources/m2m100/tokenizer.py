"""The tokenizer of an M2M-100 / NLLB directory as the service runs it: its ``tokenizer.json``, or,
for NLLB, transformers' conversion of its ``sentencepiece.bpe.model``, with the source language's
token placed where the model's own tokenizer puts it. NLLB's placement depends on
``legacy_behaviour`` (tokenizer_config.json): the token first (``eng_Latn … </s>``), or last,
after ``</s>`` (``… </s> eng_Latn``) in the legacy layout. For NLLB, transformers' tokenizer is
also the reference the export checks the served one against."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from export.sources.m2m100 import M2M100ImportError

NLLB_TOKENIZERS = ("NllbTokenizer", "NllbTokenizerFast")
NLLB_SENTENCEPIECE = "sentencepiece.bpe.model"


def tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def load_tokenizers(directory: Path, config: dict[str, Any]) -> tuple[Tokenizer, Any | None]:
    """The directory's ``tokenizers`` tokenizer (its post-processing left to
    ``with_source_token``) and, for NLLB, transformers' own tokenizer (None for M2M-100, whose
    M2M100Tokenizer reads files the service does not serve)."""
    path = directory / "tokenizer.json"
    reference = None
    if config.get("tokenizer_class") in NLLB_TOKENIZERS:
        from transformers import AutoTokenizer

        # reads tokenizer.json, or converts the SentencePiece model when there is none
        reference = AutoTokenizer.from_pretrained(str(directory))
    if path.is_file():
        return Tokenizer.from_file(str(path)), reference
    if reference is not None and (directory / NLLB_SENTENCEPIECE).is_file():
        return Tokenizer.from_str(reference.backend_tokenizer.to_str()), reference
    raise M2M100ImportError(
        f"{directory}: no tokenizer.json (and not an NLLB tokenizer with its {NLLB_SENTENCEPIECE}, "
        "which the export converts); save the model's tokenizer with transformers "
        "(tokenizer.save_pretrained) to write one"
    )


def with_source_token(tok: Tokenizer, source_token: str, legacy: bool, eos: str = "</s>") -> Tokenizer:
    """A copy of ``tok`` that puts ``source_token`` on every input as the model's tokenizer does:
    first, or after ``</s>`` for NLLB's ``legacy_behaviour``."""
    out = Tokenizer.from_str(tok.to_str())
    template = f"$A {eos} {source_token}" if legacy else f"{source_token} $A {eos}"
    special = [(eos, out.token_to_id(eos)), (source_token, out.token_to_id(source_token))]
    out.post_processor = TemplateProcessing(single=template, special_tokens=special)
    return out


def reference_encoder(reference: Any, source_token: str) -> Callable[[Sequence[str]], list[list[int]]]:
    """transformers' tokenizer encoding texts of ``source_token``'s language."""
    reference.src_lang = source_token

    def encode(texts: Sequence[str]) -> list[list[int]]:
        return [list(ids) for ids in reference(list(texts))["input_ids"]]

    return encode
