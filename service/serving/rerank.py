"""Reranking, whichever shape asked (TEI's ``texts``, Cohere's ``documents``): the model → limits →
tokenise the pairs → submit → scores in rank order.

Each query-document pair is tokenised once, here: its encoding is the queue's cost and the
engine's input. The pairs of a request go through the reranker's queue as items of their own, so
that they share batches with other requests' pairs, as embedding texts do; the same limits
apply (documents per request as texts per request, characters per text to the query and each
document) and the same errors (a pair over the model's length with ``truncate`` false names its
document). Scores are the logits' sigmoid unless the request asks for the raw logits, computed in
float64 and answered as a float32 array: the API writes them from it (orjson's NumPy support), the
shortest decimal that reads back as the float32, never through Python floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.engine.reranker import PairEncoded, Relevance, RerankItem, sigmoid
from service.queue import off_the_loop_if_large
from service.serving.failures import InvalidRequest, ModelNotFound, problem
from service.serving.limits import text_problems
from service.serving.runtime import RerankModel, Runtime
from service.serving.submit import Client, all_or_nothing, submit

_RERANK = ("rerank", "queue wait and scoring (batched with other requests)")


@dataclass(frozen=True)
class RerankRequest:
    """A query and the documents to rank by it (all-or-nothing: with ``truncate`` false one
    over-long pair fails the request). ``field`` is the documents' field in the API's body,
    which errors name; ``model``, when given, must be the served reranker's; ``raw_scores``:
    the logits instead of their sigmoid; ``top_n``: only the best so many."""

    query: str
    documents: list[str]
    field: str
    truncate: bool = True
    raw_scores: bool = False
    top_n: int | None = None
    model: str | None = None


@dataclass(frozen=True)
class Reranked:
    model: str
    indices: np.ndarray  # int64: the documents' places in the request, best first; ties in request order
    scores: np.ndarray  # float32: their scores, in the same order
    n_tokens: int  # of every pair, after truncation


def choose_rerank_model(runtime: Runtime, model: str | None = None) -> RerankModel:
    """The rerank model (one at most is served), when ``model`` is unnamed or names it; else 404."""
    if runtime.rerank_model is None:
        raise ModelNotFound(
            "no rerank model is loaded (set TSERVE_RERANK_MODEL to a cross-encoder's artefact)"
        )
    name = runtime.rerank_model.engine.manifest.name
    if model is not None and model != name:
        raise ModelNotFound(f"the model {model!r} does not exist here; this service reranks with {name!r}")
    return runtime.rerank_model


async def rerank(runtime: Runtime, client: Client, request: RerankRequest) -> Reranked:
    """``request``'s documents ranked, or the first step's refusal (``service.serving.failures``)."""
    served = choose_rerank_model(runtime, request.model)
    problems = text_problems(request.documents, request.field, runtime.limits)
    limit = runtime.limits.max_chars
    if len(request.query) > limit:
        message = f"query has {len(request.query)} characters, more than {limit}"
        problems = [problem("string_too_long", ("query",), message, limit), *problems]
    if problems:
        raise InvalidRequest(problems)
    engine = served.engine
    chars = len(request.query) * len(request.documents) + sum(len(d) for d in request.documents)
    encodings = await off_the_loop_if_large(
        chars, lambda: engine.encode_pairs(request.query, request.documents)
    )
    items = [
        RerankItem(request.query, d, request.truncate, e)
        for d, e in zip(request.documents, encodings, strict=True)
    ]
    costs = [_cost(e, request.truncate, served) for e in encodings]
    results = await submit(client, served.queue, items, costs, runtime.settings.request_timeout_s, _RERANK)
    relevances: list[Relevance] = all_or_nothing(results, request.field)
    logits = np.array([r.logit for r in relevances], dtype=np.float64)
    scores = logits if request.raw_scores else sigmoid(logits)
    order = np.argsort(-scores, kind="stable")[: request.top_n]
    return Reranked(
        engine.manifest.name,
        order,
        scores[order].astype(np.float32),
        sum(r.n_tokens for r in relevances),
    )


def _cost(encoded: PairEncoded, truncate: bool, served: RerankModel) -> int:
    """Tokens the engine will compute: a truncated pair costs at most the max length."""
    info = served.engine.manifest.rerank
    if truncate and info is not None:
        return min(encoded.n_tokens, info.max_len)
    return encoded.n_tokens
