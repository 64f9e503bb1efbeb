"""Small, real, deterministic engines for the API and queue tests (NumPy, no model files).

They implement the engine protocols exactly as the ONNX engines do (per-item results,
``TextTooLong`` for over-long texts without truncation), plus test hooks: a per-batch delay,
a gate that holds every batch until released, a word that fails its item (``FAIL``) and one
that makes the whole engine call raise (``CRASH``). Every batch they receive is recorded.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.artefacts import EmbeddingInfo, Manifest, SourceInfo, SpecialIds, TranslationInfo
from service.engine.base import (
    Embedding,
    EmbedItem,
    Encoded,
    TextTooLong,
    TranslateItem,
    Translation,
    TranslationHypothesis,
)
from service.engine.pooling import l2_normalize

FAIL_WORD = "FAIL"  # fails only the item that contains it
CRASH_WORD = "CRASH"  # makes the whole engine call raise


def _manifest(name: str, task: str, **info: object) -> Manifest:
    return Manifest.model_validate(
        {
            "name": name,
            "task": task,
            "variant": "fp32",
            "source": {"kind": "ours", "path": "tests", "sha256": "0" * 64},
            "files": [],
            "graphs": {},
            "vocab_size": 1000,
            "special_ids": SpecialIds(pad=0, bos=1, eos=2, unk=3),
            "opset": 17,
            "ir_version": 8,
            "onnxruntime_version": "test",
            "created_at": "2026-01-01T00:00:00+00:00",
            **info,
        }
    )


@dataclass
class _Hooks:
    delay_s: float = 0.0
    warmup_s: float = 0.0
    gate: threading.Event | None = None  # when set up, every batch waits for it
    batches: list[list[str]] = field(default_factory=list)
    warmed: bool = False

    def before_batch(self, texts: list[str]) -> None:
        self.batches.append(texts)
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        if self.delay_s:
            time.sleep(self.delay_s)
        if any(CRASH_WORD in t.split() for t in texts):
            raise RuntimeError("engine crashed on this batch")

    def warm(self) -> None:
        time.sleep(self.warmup_s)
        self.warmed = True


def words(text: str) -> list[str]:
    return text.split()


def _encoded(tokens: list[str]) -> Encoded:
    return Encoded(list(range(len(tokens))), tokens, truncated=False)


class HashEmbedder:
    """Mean of per-word pseudo-random vectors (seeded by the word's hash); 2 special tokens."""

    provider = "CPUExecutionProvider"

    def __init__(
        self,
        name: str = "small-embed",
        dim: int = 8,
        max_len: int = 16,
        normalize: bool = True,
        *,
        trained_on: str | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        delay_s: float = 0.0,
        warmup_s: float = 0.0,
        gate: threading.Event | None = None,
    ):
        self.manifest = _manifest(
            name,
            "embed",
            source=SourceInfo(kind="bert", path="tests", sha256="0" * 64),
            trained_on=trained_on,
            embedding=EmbeddingInfo(
                dim=dim,
                pooling="mean",
                normalize=normalize,
                max_len=max_len,
                needs_token_type_ids=False,
                prompts=prompts or {},
                default_prompt_name=default_prompt_name,
            ),
        )
        self.dim = dim
        self.max_len = max_len
        self.hooks = _Hooks(delay_s=delay_s, warmup_s=warmup_s, gate=gate)

    def count_tokens(self, text: str) -> int:
        return len(words(text)) + 2

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return [_encoded(["[CLS]", *words(t), "[SEP]"]) for t in texts]

    def warmup(self) -> None:
        self.hooks.warm()

    def vector(self, text: str, truncate: bool = True) -> np.ndarray:
        tokens = words(text)[: self.max_len - 2] if truncate else words(text)
        return np.mean([self._word(w) for w in tokens], axis=0).astype(np.float32)

    def _word(self, word: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        return np.random.default_rng(seed).standard_normal(self.dim)

    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        self.hooks.before_batch([it.text for it in items])
        out: list[Embedding | Exception] = []
        for item in items:
            n = item.encoded.n_tokens if item.encoded else self.count_tokens(item.text)
            if FAIL_WORD in words(item.text):
                out.append(RuntimeError("this item failed"))
            elif n > self.max_len and not item.truncate:
                out.append(TextTooLong(f"text has {n} tokens, more than {self.max_len}", self.max_len))
            else:
                # token-id input (no text): each id embeds as a word of its own
                ids = item.encoded.ids if item.encoded else []
                text = item.text or " ".join(f"id{i}" for i in ids)
                vector = self.vector(text, item.truncate)[: item.dimensions]
                if item.normalize:  # as the real engine does, on its worker thread
                    vector = l2_normalize(vector[None])[0]
                out.append(Embedding(vector=vector, n_tokens=min(n, self.max_len)))
        return out


class ReverseTranslator:
    """ "Translates" by reversing the words; hypothesis k also upper-cases its k-th word."""

    provider = "CPUExecutionProvider"

    def __init__(
        self,
        name: str = "small-translate",
        max_len: int = 16,
        *,
        source_languages: tuple[str, ...] = ("en",),
        target_languages: tuple[str, ...] = ("de",),
        length_penalty: float = 1.0,
        trained_on: str | None = None,
        delay_s: float = 0.0,
        warmup_s: float = 0.0,
        gate: threading.Event | None = None,
    ):
        self.manifest = _manifest(
            name,
            "translate",
            trained_on=trained_on,
            translation=TranslationInfo(
                source_languages=list(source_languages),
                target_languages=list(target_languages),
                n_layers=1,
                n_heads=1,
                d_head=4,
                max_source_len=max_len,
                max_target_len=max_len,
                has_alignments=True,
                length_penalty=length_penalty,
            ),
        )
        self.max_len = max_len
        self.hooks = _Hooks(delay_s=delay_s, warmup_s=warmup_s, gate=gate)

    def count_tokens(self, text: str) -> int:
        return len(words(text)) + 1

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return [_encoded([*words(t), "</s>"]) for t in texts]

    def warmup(self) -> None:
        self.hooks.warm()

    def translate(self, items: list[TranslateItem]) -> list[Translation | Exception]:
        self.hooks.before_batch([it.text for it in items])
        out: list[Translation | Exception] = []
        for item in items:
            source = words(item.text)
            n = item.encoded.n_tokens if item.encoded else self.count_tokens(item.text)
            if FAIL_WORD in source:
                out.append(RuntimeError("this item failed"))
            elif n > self.max_len:
                out.append(TextTooLong(f"text has {n} tokens, more than {self.max_len}", self.max_len))
            else:
                out.append(self._translate(source, item))
        return out

    def _translate(self, source: list[str], item: TranslateItem) -> Translation:
        options = item.options
        target = source[::-1][: options.max_length]
        hypotheses = []
        for k in range(options.n_best):
            tokens = [w.upper() if i == k else w for i, w in enumerate(target)]
            alignment = None
            if options.alignments:
                alignment = [
                    [1.0 if s == len(source) - 1 - t else 0.0 for s in range(len(source))]
                    for t in range(len(target))
                ]
            hypotheses.append(
                TranslationHypothesis(
                    text=" ".join(tokens), score=-0.1 * (k + 1), tokens=tokens, alignment=alignment
                )
            )
        return Translation(
            hypotheses=hypotheses,
            source_tokens=source,
            n_input_tokens=len(source) + 1,
            n_output_tokens=len(target) + 1,
        )
