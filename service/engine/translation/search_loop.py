"""A whole batch's search over any incremental decoder, step by step until every sentence is done:
the ONNX decoders' step-by-step parity checks and the PyTorch reference (export/sources/ours) decode
through it, so their outputs can be compared token for token with the served decode
(``running.py``), which drives the same ``Search``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.engine.translation.candidates import IncrementalDecoder
from service.engine.translation.constraints import Constraints
from service.engine.translation.search import Search
from service.engine.translation.sentence_search import EarlyStopping, SentenceSearch, TokenHypothesis


def beam_search(
    decoder: IncrementalDecoder,
    batch_size: int,
    *,
    beam_size: int,
    max_len: int | Sequence[int],
    bos_id: int,
    eos_id: int,
    n_best: int = 1,
    length_penalty: float = 1.0,
    early_stopping: EarlyStopping = True,
    forced_first: int | None = None,
    abandoned: Callable[[], Sequence[bool]] | None = None,
    constraints: Sequence[Constraints | None] | None = None,
    alignments: bool = True,
) -> list[list[TokenHypothesis]]:
    """n_best hypotheses per sentence, best first. beam_size=1 is greedy decoding. A search
    stops as ``early_stopping`` says (``EarlyStopping``); ``forced_first`` is every hypothesis'
    first token (``SentenceSearch``).

    Every sentence starts at once and stops at its own ``max_len`` (one limit for all, or one per
    sentence, so that a sentence's result never depends on the others in its batch); its rows
    then leave the running batch. ``abandoned``, asked before every step, flags the sentences
    nobody waits for any more: they leave at once, with the hypotheses they have (none, usually).
    ``constraints``: each sentence's required phrases (None: a free search); a constrained
    sentence needs full log-probs from ``decoder`` (its constraint tokens' scores). ``alignments``:
    keep each hypothesis' cross-attention (the decoder's second output).
    """
    limits = np.broadcast_to(np.asarray(max_len, dtype=np.int64), (batch_size,))
    sentences = [
        SentenceSearch(
            i,
            beam_size=beam_size,
            max_len=int(limits[i]),
            n_best=n_best,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            forced_first=forced_first,
            constraints=None if constraints is None else constraints[i],
            with_attention=alignments,
        )
        for i in range(batch_size)
    ]
    search = Search(bos_id, eos_id)
    search.extend([s for s in sentences if not s.done])
    decoder.reorder(np.repeat(np.array([s.key for s in search.sentences], dtype=np.int64), beam_size))
    while search.sentences:
        if abandoned is not None:
            gone = abandoned()
            if any(gone[s.key] for s in search.sentences):
                decoder.reorder(search.remove(lambda s: bool(gone[s.key])))  # noqa: B023 (called at once)
                if not search.sentences:
                    break
        log_probs, attention = decoder.step(search.last_tokens())
        rows, _ = search.advance(log_probs, attention)
        if search.sentences:
            decoder.reorder(rows)
    return [s.results() for s in sentences]
