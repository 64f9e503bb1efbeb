"""Reranking with one cross-encoder ONNX graph: query-document pairs in, one logit per pair out.

pre: tokenise each pair with the model's own tokenizer (``[CLS] query [SEP] document [SEP]``,
its token type ids kept: BERT reads the document as segment 1); an over-long pair is cut
longest-first, as Hugging Face's ``truncation=True``, sentence-transformers' CrossEncoder and
TEI cut it, or fails alone. core: sort by length and run the graph on the padded sub-batches
that cost least (``SubBatches``), as the embedder does. post: the logit of each pair, in
request order; the sigmoid (TEI's and Cohere's relevance score) is :func:`sigmoid`, applied by
the serving layer when the request asks for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.artefacts import (
    EMBEDDING_ATTENTION_MASK,
    EMBEDDING_INPUT_IDS,
    EMBEDDING_TOKEN_TYPE_IDS,
    RERANK_GRAPH,
    RERANK_OUTPUT,
    ArtefactError,
    Manifest,
    RerankInfo,
    load_and_verify,
)
from service.engine.base import Encoded, Engine, TextTooLong
from service.engine.session import DEFAULT_SESSION, SessionConfig, open_graph, used_provider, warmup
from service.engine.tokenizer import DEFAULT_SUB_BATCHES, SubBatches, right_padded
from service.metrics import INPUT_TOKENS, labelled, observe_stage, timed


@dataclass(frozen=True)
class PairEncoded:
    """A query-document pair as the model reads it, special tokens included."""

    ids: list[int]
    type_ids: list[int]  # 0 on the query, 1 on the document (BERT); what the tokenizer says
    truncated: bool

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class RerankItem:
    query: str
    document: str
    truncate: bool = True  # False: a pair over the model's max length is an error
    # The pair's whole encoding (``OnnxReranker.encode_pairs``) when the caller has it, so that a
    # pair is tokenised once, for the queue's cost and the engine alike; None: the engine does it.
    encoded: PairEncoded | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Relevance:
    logit: np.float32  # the classifier's raw output for the pair, as the graph gave it
    n_tokens: int  # after truncation


class RerankEngine(Engine, Protocol):
    def encode_pairs(self, query: str, documents: Sequence[str]) -> list[PairEncoded]:
        """Each pair's every token, not truncated (the engine cuts them when they come back)."""
        ...

    def rerank(self, items: list[RerankItem]) -> list[Relevance | Exception]: ...


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) in float64 without overflow warnings for large negative logits."""
    x = np.asarray(logits, dtype=np.float64)
    out: np.ndarray = np.exp(-np.logaddexp(0.0, -x))
    return out


def _pair(encoding: Encoding, truncated: bool) -> PairEncoded:
    return PairEncoded(list(encoding.ids), list(encoding.type_ids), truncated)


class OnnxReranker:
    """``RerankEngine`` over a verified rerank artefact directory: the cross-encoder graph's
    session, and two tokenizers of the pair, whole (for its cost) and cut longest-first."""

    def __init__(
        self,
        directory: Path,
        session: SessionConfig = DEFAULT_SESSION,
        sub_batches: SubBatches = DEFAULT_SUB_BATCHES,
    ) -> None:
        self.manifest: Manifest = load_and_verify(directory)
        self.info: RerankInfo = _rerank_info(self.manifest, directory)
        self.name = self.manifest.name
        self.pad_id = self.manifest.special_ids.pad
        self._whole, self._cut = _tokenizers(directory / self.manifest.tokenizer, self.info.max_len)
        self.session, self._inputs = open_graph(directory, self.manifest, RERANK_GRAPH, session)
        self.provider: str = used_provider(self.session)
        self.sub_batches = sub_batches.for_provider(self.provider)

    # -- Engine protocol (one text: what a query or a document alone costs) --

    def count_tokens(self, text: str) -> int:
        return len(self._whole.encode(text).ids)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        return [Encoded(e.ids, e.tokens, truncated=False) for e in self._whole.encode_batch(list(texts))]

    def warmup(self) -> None:
        """Two batch shapes through the graph, without metrics."""
        pairs = self.encode_pairs("warm up", ["a warm-up document", "another, longer warm-up document"])
        warmup(self.session, self._feeds(pairs))
        warmup(self.session, self._feeds(pairs[:1]))

    # -- RerankEngine --

    def encode_pairs(self, query: str, documents: Sequence[str]) -> list[PairEncoded]:
        if len(documents) == 1:  # one pair: no hand-off to the library's thread pool
            return [_pair(self._whole.encode(query, documents[0]), False)]
        return [_pair(e, False) for e in self._whole.encode_batch([(query, d) for d in documents])]

    def rerank(self, items: list[RerankItem]) -> list[Relevance | Exception]:
        results: list[Relevance | Exception | None] = [None] * len(items)
        with timed(self.name, "tokenize"):
            todo = self._pre(items, results)
        labelled(INPUT_TOKENS, self.name).inc(sum(p.n_tokens for p in todo.values()))
        self._core_and_post(todo, results)
        return [r if r is not None else RuntimeError("item was not processed") for r in results]

    # -- pre --

    def _pre(
        self, items: Sequence[RerankItem], results: list[Relevance | Exception | None]
    ) -> dict[int, PairEncoded]:
        """Each item's pair within the max length (cut where it may be), or its TextTooLong."""
        todo: dict[int, PairEncoded] = {}
        for i, item in enumerate(items):
            whole = item.encoded or self.encode_pairs(item.query, [item.document])[0]
            if whole.n_tokens <= self.info.max_len:
                todo[i] = whole
            elif item.truncate:  # re-encoded with truncation so the specials survive the cut
                todo[i] = _pair(self._cut.encode(item.query, item.document), True)
            else:
                message = f"query and document have {whole.n_tokens} tokens; the model takes at most "
                results[i] = TextTooLong(message + str(self.info.max_len), self.info.max_len)
        return todo

    # -- core + post, per length-sorted sub-batch --

    def _core_and_post(
        self, todo: dict[int, PairEncoded], results: list[Relevance | Exception | None]
    ) -> None:
        started = time.perf_counter()
        for chunk in self.sub_batches.cut({i: pair.n_tokens for i, pair in todo.items()}):
            try:
                (logits,) = self.session.run([RERANK_OUTPUT], self._feeds([todo[i] for i in chunk]))
                # the run's own rows: the device pads runs to a few shapes
                scores = np.asarray(logits[: len(chunk)], dtype=np.float32).reshape(len(chunk), -1)[:, 0]
            except Exception as e:  # a failing sub-batch fails its own items only
                for i in chunk:
                    results[i] = e
                continue
            for i, score in zip(chunk, scores, strict=True):
                results[i] = Relevance(logit=score, n_tokens=todo[i].n_tokens)
        if todo:
            observe_stage(self.name, "encoder", time.perf_counter() - started)

    def _feeds(self, pairs: Sequence[PairEncoded]) -> dict[str, np.ndarray]:
        """Right-padded ids, mask and (where the graph takes them) token type ids, int64 (B, T), in
        the run's shape (``SubBatches.run_shape``)."""
        rows, width = self.sub_batches.run_shape(
            len(pairs), max(p.n_tokens for p in pairs), self.info.max_len
        )
        ids, mask = right_padded([p.ids for p in pairs], self.pad_id, rows, width)
        types, _ = right_padded([p.type_ids for p in pairs], 0, rows, width)
        feeds = {EMBEDDING_INPUT_IDS: ids, EMBEDDING_ATTENTION_MASK: mask, EMBEDDING_TOKEN_TYPE_IDS: types}
        return {k: v for k, v in feeds.items() if k in self._inputs}


def _tokenizers(path: Path, max_len: int) -> tuple[Tokenizer, Tokenizer]:
    """The artefact's tokenizer twice: whole (no truncation, no padding: the engine pads its
    batches) and cutting pairs longest-first at ``max_len``; two instances, so that truncating
    never flips settings on a shared object."""
    try:
        whole = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception on a bad file
        raise ArtefactError(f"{path}: cannot load the tokenizer: {e}") from e
    whole.no_truncation()
    whole.no_padding()
    cut = Tokenizer.from_str(whole.to_str())
    cut.enable_truncation(max_len, strategy="longest_first")
    return whole, cut


def _rerank_info(manifest: Manifest, directory: Path) -> RerankInfo:
    if manifest.task != "rerank" or manifest.rerank is None:
        raise ArtefactError(f"{directory / 'manifest.json'}: task {manifest.task!r} is not a reranker")
    return manifest.rerank
