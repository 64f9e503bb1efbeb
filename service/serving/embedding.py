"""Embeddings, whichever API asked (``/v1/embed``, OpenAI's ``/v1/embeddings``): the model →
limits → the model's options (prompt, dimensions) → submit.

Each text goes to the queue with the prompt put before it (as sentence-transformers does: the
model's default prompt when the request names none) and is tokenized on the engine's worker
thread, with every other text of its batch in one call: nothing of it is tokenized on the event
loop. Its cost in the queue is estimated from its characters (``_cost``); the engine's sub-batches
hold to the token budget by the real counts. Token ids (OpenAI's, TEI's and vLLM's other input
form) are the model's whole input as given, special tokens included; cut at the model's length
like a text (keeping the closing special token). The engine cuts vectors to ``dimensions`` and
normalises them when asked (on its worker thread, not on the event loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from service.artefacts import EmbeddingInfo, Manifest
from service.engine.base import Embedding, EmbedItem, Encoded
from service.serving.failures import InvalidRequest, Problem, problem
from service.serving.limits import text_problems
from service.serving.routing import choose_embedding_model
from service.serving.runtime import Runtime
from service.serving.submit import Client, all_or_nothing, submit

_EMBED = ("embed", "queue wait and encoding (batched with other requests)")

TokenIds = Sequence[int]


@dataclass(frozen=True)
class EmbeddingRequest:
    """Texts or token-id lists to embed (all-or-nothing: with ``truncate`` false one over-long
    input fails the request). ``field`` is the inputs' field in the API's body, which errors name;
    ``model``, when given, must be a served model; ``normalize`` None is the model's own pipeline;
    ``prompt_name`` one of the model's prompts (None: its default prompt, if any); ``dimensions``
    keeps the first N of the model's dimensions."""

    inputs: Sequence[str | TokenIds]
    field: str
    truncate: bool = True
    normalize: bool | None = None
    model: str | None = None
    dimensions: int | None = None
    prompt_name: str | None = None


@dataclass(frozen=True)
class Embedded:
    model: str
    embeddings: list[Embedding]


async def embed(runtime: Runtime, client: Client, request: EmbeddingRequest) -> Embedded:
    """``request`` embedded, or the first step's refusal (``service.serving.failures``)."""
    served = choose_embedding_model(runtime, request.model)
    manifest = served.engine.manifest
    info = manifest.embedding
    if info is None:  # choose_embedding_model serves embedding artefacts only
        raise RuntimeError(f"{manifest.name} is not an embedding model")
    inputs, field = request.inputs, request.field
    texts_only = all(isinstance(x, str) for x in inputs)
    # token ids have no characters to count: their number is checked, their length is the model's
    texts = cast(Sequence[str], inputs) if texts_only else [x if isinstance(x, str) else "" for x in inputs]
    problems = text_problems(texts, field, runtime.limits)
    problems += _option_problems(manifest, info, request)
    problems += [] if texts_only else _id_problems(manifest, inputs, field)
    if problems:
        raise InvalidRequest(problems)
    prompt = info.prompt(request.prompt_name)
    normalize = info.normalize if request.normalize is None else request.normalize
    dimensions = None if request.dimensions == info.dim else request.dimensions
    truncate = request.truncate
    if texts_only:  # the usual request: no per-text branch
        items = [EmbedItem(prompt + x, truncate, None, normalize, dimensions) for x in texts]
    else:
        frame = served.engine.encode([""])[0].ids
        items = [
            EmbedItem(prompt + x, truncate, None, normalize, dimensions)
            if isinstance(x, str)
            else EmbedItem("", truncate, _given_ids(x, frame, info.max_len, truncate), normalize, dimensions)
            for x in inputs
        ]
    costs = [_cost(item, info) for item in items]
    results = await submit(client, served.queue, items, costs, runtime.settings.request_timeout_s, _EMBED)
    return Embedded(manifest.name, all_or_nothing(results, field))


def _option_problems(manifest: Manifest, info: EmbeddingInfo, request: EmbeddingRequest) -> list[Problem]:
    found: list[Problem] = []
    if request.dimensions is not None and request.dimensions > info.dim:
        message = f"{manifest.name} returns {info.dim}-dimensional vectors: dimensions may be 1 to {info.dim}"
        found.append(problem("unsupported_dimensions", ("dimensions",), message, info.dim))
    if request.prompt_name is not None:
        if request.prompt_name not in info.prompts:
            named = ", ".join(sorted(info.prompts)) or "none"
            message = f"{manifest.name} has no prompt {request.prompt_name!r} (its prompts: {named})"
            found.append(problem("unknown_prompt", ("prompt_name",), message))
        elif not all(isinstance(x, str) for x in request.inputs):
            message = "a prompt is put before a text: token ids are the model's whole input"
            found.append(problem("prompt_with_token_ids", ("prompt_name",), message))
    return found


def _id_problems(manifest: Manifest, inputs: Sequence[str | TokenIds], field: str) -> list[Problem]:
    """Each token-id list's first id outside the model's vocabulary."""
    found: list[Problem] = []
    for i, ids in enumerate(inputs):
        if isinstance(ids, str):
            continue
        j = next((j for j, t in enumerate(ids) if not 0 <= t < manifest.vocab_size), None)
        if j is not None:
            message = (
                f"token id {ids[j]} is outside {manifest.name}'s vocabulary (0 to {manifest.vocab_size - 1})"
            )
            found.append(problem("token_id_out_of_range", (field, i, j), message, manifest.vocab_size - 1))
    return found


def _given_ids(ids: TokenIds, frame: list[int], max_len: int, truncate: bool) -> Encoded:
    """Token ids as the engine's input. Cut at ``max_len`` when ``truncate`` as a text is: a list
    ending with the token the tokenizer closes every text with ([SEP], </s>) keeps it; longer
    ones not cut fail in the engine, like a text (TextTooLong)."""
    ids = list(ids)
    if not truncate or len(ids) <= max_len:
        return Encoded(ids, [], truncated=False)
    closing = frame[-1:] if frame and ids[-1] == frame[-1] else []
    return Encoded(ids[: max_len - len(closing)] + closing, [], truncated=True)


CHARS_PER_TOKEN = 3
"""A text's tokens estimated from its characters for the queue's token budget: a word-piece
covers about four characters of English, so three over-counts a little (and the batches stay
within the budget); the engine cuts its runs by the real counts."""


def _cost(item: EmbedItem, info: EmbeddingInfo) -> int:
    """Tokens the engine will compute (a truncated input at most the max length): the count of
    given ids, else the estimate of a text's."""
    n = item.encoded.n_tokens if item.encoded is not None else len(item.text) // CHARS_PER_TOKEN + 2
    return min(n, info.max_len) if item.truncate else n
