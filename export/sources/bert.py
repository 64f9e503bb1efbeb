"""BERT-family sentence-embedding sources: a local Hugging Face model directory.

The directory holds config.json, weights and tokenizer.json, plus sentence-transformers'
modules.json / 1_Pooling/config.json when it is a sentence-transformers pipeline (pooling mode,
Normalize module and max_seq_length are read from there; a plain HF model gets mean pooling and
no normalisation, as sentence-transformers gives it) and config_sentence_transformers.json's
prompts (the text each input is prefixed with, by name, and the default one).
:func:`inspect_source` reads only JSON files (no torch), so an unsupported directory fails fast;
:func:`pooled_module` is the graph the export traces: the model with exactly the I/O of
the artefact's ``encoder.onnx`` (``service.artefacts.EMBEDDING_*``), its pooling included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from service.artefacts import (
    EMBEDDING_ATTENTION_MASK,
    EMBEDDING_INPUT_IDS,
    EMBEDDING_TOKEN_TYPE_IDS,
    EmbeddingInfo,
    SpecialIds,
)

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
TOKENIZER_FILE = "tokenizer.json"

Pooling = Literal["mean", "cls", "lasttoken"]
# sentence-transformers' pooling config keys, older (pooling_mode_*) and newer (pooling_mode: name)
_POOLING_KEYS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_cls_tokens": "cls",
    "pooling_mode_lasttoken": "lasttoken",
}
_POOLING_NAMES: tuple[Pooling, ...] = ("mean", "cls", "lasttoken")


@dataclass(frozen=True)
class EmbeddingSource:
    """What the export needs to know about a source directory, read from its JSON files only."""

    directory: Path
    model_type: str
    dim: int
    num_heads: int
    vocab_size: int
    pooling: Pooling
    normalize: bool
    max_len: int
    needs_token_type_ids: bool
    weight_files: tuple[Path, ...]
    pad_id: int | None  # config.json's, when it names one
    prompts: dict[str, str]  # config_sentence_transformers.json's, by name
    default_prompt_name: str | None

    def info(self) -> EmbeddingInfo:
        return EmbeddingInfo(
            dim=self.dim,
            pooling=self.pooling,
            normalize=self.normalize,
            max_len=self.max_len,
            needs_token_type_ids=self.needs_token_type_ids,
            prompts=self.prompts,
            default_prompt_name=self.default_prompt_name,
        )

    @property
    def input_names(self) -> list[str]:
        names = [EMBEDDING_INPUT_IDS, EMBEDDING_ATTENTION_MASK]
        return [*names, EMBEDDING_TOKEN_TYPE_IDS] if self.needs_token_type_ids else names


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _pipeline_modules(directory: Path) -> tuple[Pooling, bool]:
    """(pooling, normalize) from sentence-transformers' modules.json; a plain HF dir → mean, no."""
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return "mean", False
    modules = _read_json(modules_path)
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = [t for t in types if t not in ("Transformer", "Pooling", "Normalize")]
    if unsupported:
        raise ValueError(f"{modules_path}: modules {unsupported} are not supported (only Pooling/Normalize)")
    pooling: Pooling = "mean"
    for module in modules:
        if str(module.get("type", "")).endswith("Pooling"):
            pooling = _pooling_mode(directory / module.get("path", "1_Pooling") / "config.json")
    return pooling, "Normalize" in types


def _pooling_mode(config_path: Path) -> Pooling:
    config = _read_json(config_path) if config_path.is_file() else {}
    if config.get("include_prompt") is False:  # pooling would have to skip the prompt's tokens
        raise ValueError(f"{config_path}: include_prompt false is not supported (prompt tokens are pooled)")
    if "pooling_mode" in config:  # newer sentence-transformers write the mode by name (or a list)
        named = config["pooling_mode"]
        enabled = [named] if isinstance(named, str) else list(named)
    else:
        enabled = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v is True)
        enabled = [_POOLING_KEYS.get(k, k) for k in enabled] or ["mean"]  # none enabled: ST's default
    if len(enabled) == 1 and enabled[0] in _POOLING_NAMES:
        mode: Pooling = enabled[0]
        return mode
    raise ValueError(f"{config_path}: pooling {enabled} is not supported (mean, cls or lasttoken only)")


def _prompts(directory: Path) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' prompts and default prompt name; none for a model without them."""
    path = directory / "config_sentence_transformers.json"
    config = _read_json(path) if path.is_file() else {}
    prompts = {str(k): str(v) for k, v in (config.get("prompts") or {}).items() if v is not None}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{path}: default_prompt_name {default!r} not in the prompts {sorted(prompts)}")
    return prompts, None if default is None else str(default)


def _max_len(directory: Path, config: dict[str, Any]) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's, capped by the positions."""
    candidates: list[int] = []
    st_config = directory / "sentence_bert_config.json"
    if st_config.is_file() and _read_json(st_config).get("max_seq_length"):
        candidates.append(int(_read_json(st_config)["max_seq_length"]))
    tok_config = directory / "tokenizer_config.json"
    if not candidates and tok_config.is_file():
        length = _read_json(tok_config).get("model_max_length")
        if isinstance(length, int | float) and 0 < length < 1_000_000:
            candidates.append(int(length))
    positions = config.get("max_position_embeddings")
    if positions:  # roberta-style positions start after the padding index
        roberta_like = config["model_type"] in ("roberta", "xlm-roberta")
        offset = int(config.get("pad_token_id") or 0) + 1 if roberta_like else 0
        candidates.append(int(positions) - offset)
    if not candidates:
        raise ValueError(f"{directory}: cannot tell the maximum sequence length")
    return min(candidates)


def _weight_files(directory: Path) -> tuple[Path, ...]:
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        found = sorted(directory.glob(pattern))
        if found:
            return tuple(found)
    raise ValueError(f"{directory}: no weight file (*.safetensors or pytorch_model.bin)")


def inspect_source(directory: Path) -> EmbeddingSource:
    """Read the source's config without loading torch; raise ValueError for what we cannot export."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{directory}: no config.json (not a Hugging Face model directory)")
    config = _read_json(config_path)
    model_type = str(config.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{directory}: model_type {model_type!r} is not supported for embeddings "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    pooling, normalize = _pipeline_modules(directory)
    prompts, default_prompt_name = _prompts(directory)
    pad = config.get("pad_token_id")
    return EmbeddingSource(
        directory=directory,
        model_type=model_type,
        dim=int(config.get("hidden_size") or config["dim"]),
        num_heads=int(config.get("num_attention_heads") or config.get("n_heads") or 0),
        vocab_size=int(config["vocab_size"]),
        pooling=pooling,
        normalize=normalize,
        max_len=_max_len(directory, config),
        # a single segment type needs no input: the model's own zeros are the same thing
        needs_token_type_ids=model_type == "bert" and int(config.get("type_vocab_size", 0)) > 1,
        weight_files=_weight_files(directory),
        pad_id=None if pad is None else int(pad),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )


def served_tokenizer(source: EmbeddingSource) -> Tokenizer:
    """The source's fast tokenizer with truncation at ``max_len`` and padding off.

    sentence-transformers truncates at max_seq_length whatever tokenizer.json says (MiniLM's
    file says 128 and pads to 128); the served copy must do what the pipeline does.
    """
    tokenizer = source_tokenizer(source.directory)
    tokenizer.enable_truncation(max_length=source.max_len)
    return tokenizer


def source_tokenizer(directory: Path) -> Tokenizer:
    """The source's fast tokenizer without padding: its tokenizer.json, or transformers'
    conversion of a slow-tokenizer-only source."""
    from tokenizers import Tokenizer

    path = directory / TOKENIZER_FILE
    if path.is_file():
        tokenizer = Tokenizer.from_file(str(path))
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory)).backend_tokenizer
    tokenizer.no_padding()
    return tokenizer


def special_ids(source: EmbeddingSource, tokenizer: Tokenizer) -> SpecialIds:
    """The padding id (config.json's, else the tokenizer's [PAD]/<pad>, else 0) and unknown id."""
    pad = source.pad_id
    if pad is None:
        found = [tokenizer.token_to_id(t) for t in ("[PAD]", "<pad>")]
        pad = next((i for i in found if i is not None), 0)
    unk_token = getattr(tokenizer.model, "unk_token", None)
    unk = tokenizer.token_to_id(unk_token) if isinstance(unk_token, str) else None
    return SpecialIds(pad=int(pad), unk=unk)


def pooled_module(source: EmbeddingSource) -> torch.nn.Module:
    """The model (eager attention: the pattern onnxruntime's optimizer fuses) as a module whose
    positional inputs are ``source.input_names`` and whose outputs are the pooled vectors and
    the same L2-normalised (``service.artefacts.EMBEDDING_OUTPUTS``): pooling and normalisation
    are in the graph, so that the service gets (batch, dim) float32 rows it writes as they are.

    Numerics follow sentence-transformers: mean pooling divides by the token count clamped at
    1e-9, normalisation by max(norm, 1e-12) (``torch.nn.functional.normalize``); last-token
    pooling takes each row's last real token (the service pads on the right); a row with no
    token pools to zeros."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(source.directory), attn_implementation="eager").float().eval()
    names, pooling = source.input_names, source.pooling

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            feeds = dict(zip(names, inputs, strict=True))
            hidden = self.model(**feeds).last_hidden_state.float()
            pooled = pool(hidden, feeds[EMBEDDING_ATTENTION_MASK], pooling)
            return pooled, torch.nn.functional.normalize(pooled, p=2.0, dim=1, eps=1e-12)

    return Pooled()


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """(batch, seq, dim) hidden states and their (batch, seq) mask → (batch, dim), as the
    graph computes it (``pooled_module``)."""
    import torch

    m = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "lasttoken":
        counts = mask.sum(dim=1)
        last = (counts - 1).clamp(min=0)
        picked = hidden[torch.arange(hidden.shape[0]), last]
        return picked * (counts > 0).unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def called_by_position(model: Any, names: Sequence[str], output: str) -> torch.nn.Module:
    """``model`` as torch.onnx traces it: its inputs ``names`` given by position, its output
    field ``output`` returned."""
    import torch

    class ByPosition(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = getattr(self.model(**dict(zip(names, inputs, strict=True))), output)
            return out

    return ByPosition()
