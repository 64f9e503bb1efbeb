"""The configured request limits, checked before any work is queued.

The schemas (``service/api/schemas/``) hold absolute ceilings; these are the operator's, usually
lower, limits (``TSERVE_MAX_*``), and the checks that need a request's sentences. Each check
returns the problems it finds (none: within the limits), in the 422 shape of the schema's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.serving.failures import Problem, problem
from service.settings import Settings


@dataclass(frozen=True)
class RequestLimits:
    max_items: int
    max_chars: int
    max_translate_chars: int  # all texts of a translation request together
    max_sentences: int  # sentences of a translation request
    max_decode_cost: int  # sentences × beam_size × max_length of a translation request

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(
            max_items=settings.max_items_per_request,
            max_chars=settings.max_chars_per_text,
            max_translate_chars=settings.max_translate_chars_per_request,
            # a request's sentences are admitted to the queue together, so never more than it holds
            max_sentences=min(settings.max_sentences_per_request, settings.max_queue),
            max_decode_cost=settings.max_decode_cost_per_request,
        )


def text_problems(texts: Sequence[str], field: str, limits: RequestLimits) -> list[Problem]:
    """Too many texts, else every text that is too long."""
    if len(texts) > limits.max_items:
        message = f"at most {limits.max_items} texts per request, got {len(texts)}"
        return [problem("too_long", (field,), message, limits.max_items)]
    return [
        problem(
            "string_too_long",
            (field, i),
            f"text has {len(text)} characters, more than {limits.max_chars}",
            limits.max_chars,
        )
        for i, text in enumerate(texts)
        if len(text) > limits.max_chars
    ]


def translation_text_problems(texts: Sequence[str], field: str, limits: RequestLimits) -> list[Problem]:
    """``text_problems``, else texts longer together than a translation request may be."""
    found = text_problems(texts, field, limits)
    total = sum(len(t) for t in texts)
    if not found and total > limits.max_translate_chars:
        message = f"at most {limits.max_translate_chars} characters per request, got {total}"
        found = [problem("too_long", (field,), message, limits.max_translate_chars)]
    return found


def sentence_problems(
    n_sentences: int, beam_size: int, max_length: int, field: str, limits: RequestLimits
) -> list[Problem]:
    """Too many sentences, else a search too large: what bounds the work of one request."""
    if n_sentences > limits.max_sentences:
        message = f"at most {limits.max_sentences} sentences per request, got {n_sentences}"
        return [problem("too_many_sentences", (field,), message, limits.max_sentences)]
    cost = n_sentences * beam_size * max_length
    if cost > limits.max_decode_cost:
        message = (
            f"{n_sentences} sentences × beam_size {beam_size} × max_length {max_length} = {cost} output "
            f"tokens to search, more than {limits.max_decode_cost}: lower beam_size or max_length, or "
            "send fewer sentences per request"
        )
        return [problem("decode_cost_too_high", (field,), message, limits.max_decode_cost)]
    return []
