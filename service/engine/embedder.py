"""Sentence embeddings with one encoder ONNX graph: batch in, one pooled vector per item out.

pre: tokenize the batch's texts in one call (over-long texts are cut or fail alone). core: sort
by length and run the encoder on the padded sub-batches that cost least (``SubBatches``), so
short texts do not pay for a long one's padding. The graph pools and normalises (its two outputs,
``EMBEDDING_OUTPUTS``): post takes each item's row of the one it asked for, a view of the
sub-batch's float32 array that the API writes as it is. L2 normalisation is an API option, and
so is keeping only the first dimensions (Matryoshka models), which comes before the
normalisation so that a shortened vector is a unit vector again (the one case computed here).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from service.artefacts import (
    EMBEDDING_ATTENTION_MASK,
    EMBEDDING_INPUT_IDS,
    EMBEDDING_OUTPUTS,
    EMBEDDING_TOKEN_TYPE_IDS,
    ArtefactError,
    EmbeddingInfo,
    Manifest,
    load_and_verify,
)
from service.engine.base import Embedding, EmbedItem, Encoded
from service.engine.pooling import l2_normalize
from service.engine.session import DEFAULT_SESSION, SessionConfig, open_graph, used_provider, warmup
from service.engine.tokenizer import DEFAULT_SUB_BATCHES, SubBatches, TextTokenizer
from service.metrics import INPUT_TOKENS, labelled, observe_stage, timed


class OnnxEmbedder:
    """``EmbedEngine`` over a verified embedding artefact directory: its encoder graph's session
    (``session`` says how it runs), its tokenizer, and the pooling its manifest names."""

    def __init__(
        self,
        directory: Path,
        session: SessionConfig = DEFAULT_SESSION,
        sub_batches: SubBatches = DEFAULT_SUB_BATCHES,
    ) -> None:
        self.manifest: Manifest = load_and_verify(directory)
        self.info = _embedding_info(self.manifest, directory)
        self.name = self.manifest.name
        self.tokenizer = TextTokenizer.from_file(
            directory / self.manifest.tokenizer, self.info.max_len, self.manifest.special_ids.pad
        )
        self.session, self._inputs = open_graph(directory, self.manifest, "encoder", session)
        self.provider: str = used_provider(self.session)
        self.sub_batches = sub_batches.for_provider(self.provider)

    # -- Engine protocol --

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count(text)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return self.tokenizer.encode(texts)

    def warmup(self) -> None:
        """Two batch shapes through the graph, without metrics."""
        texts = ["warm up", "a longer warm-up sentence"]
        encoded = [
            e for e in self.tokenizer.encode_ids(texts, [True, True], [None, None]) if isinstance(e, Encoded)
        ]
        warmup(self.session, self._feeds([e.ids for e in encoded]))
        warmup(self.session, self._feeds([encoded[0].ids]))

    def embed(self, items: list[EmbedItem]) -> list[Embedding | Exception]:
        results: list[Embedding | Exception | None] = [None] * len(items)
        todo = self._pre(items, results)
        self._core_and_post(items, todo, results)
        return [r if r is not None else RuntimeError("item was not processed") for r in results]

    # -- pre --

    def _pre(
        self, items: Sequence[EmbedItem], results: list[Embedding | Exception | None]
    ) -> dict[int, Encoded]:
        with timed(self.name, "tokenize"):
            encoded = self.tokenizer.encode_ids(
                [it.text for it in items], [it.truncate for it in items], [it.encoded for it in items]
            )
        todo: dict[int, Encoded] = {}
        for i, enc in enumerate(encoded):
            if isinstance(enc, Exception):
                results[i] = enc
            else:
                todo[i] = enc
        labelled(INPUT_TOKENS, self.name).inc(sum(e.n_tokens for e in todo.values()))
        return todo

    # -- core + post, per length-sorted sub-batch --

    def _core_and_post(
        self,
        items: Sequence[EmbedItem],
        todo: dict[int, Encoded],
        results: list[Embedding | Exception | None],
    ) -> None:
        encoder_s = post_s = 0.0
        for chunk in self.sub_batches.cut({i: e.n_tokens for i, e in todo.items()}):
            try:
                start = time.perf_counter()
                pooled, unit = self.session.run(
                    list(EMBEDDING_OUTPUTS), self._feeds([todo[i].ids for i in chunk])
                )
                mid = time.perf_counter()
                n = len(chunk)  # the run's own rows: the device pads runs to a few shapes
                vectors = self._post(pooled[:n], unit[:n], [items[i] for i in chunk])
                post_s += time.perf_counter() - mid
                encoder_s += mid - start
            except Exception as e:  # a failing sub-batch fails its own items only
                for i in chunk:
                    results[i] = e
                continue
            for i, vector in zip(chunk, vectors, strict=True):
                results[i] = Embedding(vector=vector, n_tokens=todo[i].n_tokens)
        if todo:
            observe_stage(self.name, "encoder", encoder_s)
            observe_stage(self.name, "pool", post_s)

    def _feeds(self, ids: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        rows, width = self.sub_batches.run_shape(len(ids), max(map(len, ids)), self.info.max_len)
        input_ids, mask = self.tokenizer.pad(ids, rows, width)
        feeds = {EMBEDDING_INPUT_IDS: input_ids, EMBEDDING_ATTENTION_MASK: mask}
        if EMBEDDING_TOKEN_TYPE_IDS in self._inputs:
            feeds[EMBEDDING_TOKEN_TYPE_IDS] = np.zeros_like(input_ids)
        return {k: v for k, v in feeds.items() if k in self._inputs}

    @staticmethod
    def _post(pooled: np.ndarray, unit: np.ndarray, items: Sequence[EmbedItem]) -> list[np.ndarray]:
        """Each item's row of the graph's output it asked for; cut to its ``dimensions``, then
        L2-normalised where it asks."""
        vectors = [unit[k] if it.normalize else pooled[k] for k, it in enumerate(items)]
        for k, it in enumerate(items):
            if it.dimensions is not None:
                cut = np.ascontiguousarray(pooled[k, : it.dimensions])
                vectors[k] = l2_normalize(cut[None])[0] if it.normalize else cut
        return vectors


def _embedding_info(manifest: Manifest, directory: Path) -> EmbeddingInfo:
    if manifest.task != "embed" or manifest.embedding is None:
        raise ArtefactError(f"{directory / 'manifest.json'}: task {manifest.task!r} is not an embedding")
    if not manifest.embedding_graph_current:
        raise ArtefactError(
            f"{directory / 'manifest.json'}: its graph returns hidden states, from before pooling moved "
            "into the graph: export it again"
        )
    return manifest.embedding
