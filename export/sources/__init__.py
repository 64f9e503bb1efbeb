"""Checkpoints that can be exported: each source loads into modules with the project's ONNX layout.

A translation source (ours in ``export.sources.ours.source``, Marian in ``export.sources.marian.source``)
turns a checkpoint into a :class:`TranslationSource`: two wrapper modules with exactly the I/O of
``encoder.onnx``/``decoder.onnx``, a ``tokenizers`` tokenizer for the service, and a PyTorch
reference (the source framework's own code) the exported graphs are verified against.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from service.artefacts import SpecialIds


class IncrementalDecoder(Protocol):
    """The search's decoder protocol (``service.engine.translation.search``), restated for typing."""

    def step(self, last_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]: ...

    def reorder(self, rows: np.ndarray) -> None: ...


class TorchReference(Protocol):
    """What the exported graphs must reproduce, computed by the source framework's own code."""

    def memory_kv(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) padded ids → cross-attention keys, values (n_layers, B, h, S, d_head)."""
        ...

    def decoder(self, src: torch.Tensor) -> IncrementalDecoder:
        """A cached decoder over (B, S) padded ids whose step also returns cross-attention."""
        ...

    def greedy(self, src_ids: Sequence[Sequence[int]], max_lens: Sequence[int]) -> list[list[int]]:
        """Greedy output ids (no start token, no </s>) per source, at most ``max_lens[i]`` tokens,
        as the framework decodes them."""
        ...


# dtype, and whether the decoder steps over slot caches (export/graphs/translation_layout.py,
# ``DecoderIO.slots``) → (encoder, decoder step) modules
GraphBuilder = Callable[[torch.dtype, bool], tuple[nn.Module, nn.Module]]


@dataclass(frozen=True)
class TranslationSource:
    """A loaded translation checkpoint, ready to export."""

    kind: Literal["ours", "marian", "m2m100"]
    name: str  # artefact name: <out_root>/<name>/<variant>/
    path: Path
    weight_files: tuple[Path, ...]  # hashed into the manifest's source.sha256
    tokenizer: Tokenizer  # written as tokenizer.json; encode appends </s>
    special: SpecialIds  # bos = decoder start token
    vocab_size: int  # of log_probs
    n_layers: int  # decoder layers
    n_heads: int
    d_head: int
    max_source_len: int
    max_target_len: int
    source_languages: list[str]
    target_languages: list[str]
    build_graphs: GraphBuilder
    reference: TorchReference
    tokenizer_file: Path | None = None  # copied verbatim when the source has a tokenizer.json
    # The source framework's own tokenizer, when it is not ``tokenizer`` (e.g. a converted one):
    # the export checks both give the same ids.
    reference_encode: Callable[[Sequence[str]], list[list[int]]] | None = None
    # Requests' default (score = log-prob / length ** penalty): the source's generation config.
    length_penalty: float = 1.0
    # Multilingual models: each target language's token, forced first (TranslationInfo's field).
    language_tokens: dict[str, int] = field(default_factory=dict)
    # When a beam search stops (TranslationInfo's field): Hugging Face models' own rule.
    early_stopping: bool | Literal["never"] = True


GENERATION_CONFIG = "generation_config.json"  # Hugging Face's name; ours keep theirs beside them


def generation_length_penalty(directory: Path) -> float:
    """``length_penalty`` of ``directory/generation_config.json`` (tuned on the model's
    validation set, Hugging Face's meaning: log-prob / length ** penalty); 1.0 without one."""
    path = directory / GENERATION_CONFIG
    if not path.is_file():
        return 1.0
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("length_penalty", 1.0)
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{path}: unreadable generation config ({e})") from e
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value <= 2.0:
        raise ValueError(f"{path}: length_penalty must be a number in [0, 2], not {value!r}")
    return float(value)


def languages_from_name(name: str, default: tuple[str, str] = ("en", "de")) -> tuple[list[str], list[str]]:
    """ "transformer-en-de", "opus-mt-en-de" → ["en"], ["de"]: the last two short dash-separated parts."""
    parts = name.split("-")
    if len(parts) >= 2 and all(1 < len(p) <= 3 and p.isalpha() for p in parts[-2:]):
        return [parts[-2]], [parts[-1]]
    return [default[0]], [default[1]]
