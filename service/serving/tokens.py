"""The embedding model's tokenizer on its own: texts → tokens with their character offsets, token
ids → text (TEI's ``/tokenize`` and ``/decode``).

The engines tokenize for their own runs and expose ids and token strings only; these answers need
the tokenizer's offsets, its special-token flags and its decoder with either setting, so the
artefact's own ``tokenizer.json`` is loaded here, once per artefact directory. Nothing is queued:
a request is bounded by the text limits, and a large one is tokenized off the event loop.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from service.queue import off_the_loop_if_large
from service.serving.failures import InvalidRequest, ModelNotFound, problem
from service.serving.limits import text_problems
from service.serving.routing import choose_embedding_model
from service.serving.runtime import Runtime


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the input's characters it covers; a special token's own string
    special: bool
    start: int | None  # character offsets in the input (prompt included); None for a special token
    stop: int | None


@functools.lru_cache(maxsize=4)
def _load(path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _tokenizer(runtime: Runtime) -> Tokenizer:
    manifest = choose_embedding_model(runtime).engine.manifest
    path = runtime.settings.model_dir(manifest.name, manifest.variant) / manifest.tokenizer
    if not path.is_file():
        raise ModelNotFound(f"{manifest.name} was not loaded from an artefact: it has no tokenizer to serve")
    return _load(path)


async def tokenize(
    runtime: Runtime, texts: Sequence[str], field: str, add_special_tokens: bool, prompt_name: str | None
) -> list[list[Token]]:
    """Each text's tokens, after the prompt is put before it as ``/embed`` does (``prompt_name``
    None: the model's default prompt, if any)."""
    problems = text_problems(list(texts), field, runtime.limits)
    if problems:
        raise InvalidRequest(problems)
    info = choose_embedding_model(runtime).engine.manifest.embedding
    if info is None:  # choose_embedding_model serves embedding artefacts only
        raise RuntimeError("the embedding model has no embedding section")
    if prompt_name is not None and prompt_name not in info.prompts:
        named = ", ".join(sorted(info.prompts)) or "none"
        raise InvalidRequest(
            [problem("unknown_prompt", ("prompt_name",), f"no prompt {prompt_name!r} ({named})")]
        )
    tokenizer = _tokenizer(runtime)
    prompted = [info.prompt(prompt_name) + t for t in texts]

    def run() -> list[list[Token]]:
        encodings = tokenizer.encode_batch(prompted, add_special_tokens=add_special_tokens)
        return [
            [
                Token(i, tokenizer.id_to_token(i) or "", True, None, None)
                if special
                else Token(i, text[start:stop], False, start, stop)
                for i, special, (start, stop) in zip(e.ids, e.special_tokens_mask, e.offsets, strict=True)
            ]
            for text, e in zip(prompted, encodings, strict=True)
        ]

    return await off_the_loop_if_large(sum(len(t) for t in prompted), run)


def decode(
    runtime: Runtime, ids: Sequence[Sequence[int]], field: str, skip_special_tokens: bool
) -> list[str]:
    """Each token-id list as text; an id outside the vocabulary is a 422 naming it."""
    limit = runtime.limits.max_items
    if len(ids) > limit:
        message = f"at most {limit} token-id lists per request, got {len(ids)}"
        raise InvalidRequest([problem("too_long", (field,), message, limit)])
    tokenizer = _tokenizer(runtime)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    problems = [
        problem("token_id_out_of_range", (field, i, j), f"token id {x} is outside the vocabulary", size - 1)
        for i, row in enumerate(ids)
        for j, x in enumerate(row)
        if x >= size
    ]
    if problems:
        raise InvalidRequest(problems[:10])
    return list(tokenizer.decode_batch([list(row) for row in ids], skip_special_tokens=skip_special_tokens))
