"""The decoder step's candidates by blocks of the vocabulary: one ``TopK`` over (rows, vocab)
becomes a cheap pass and two small ``TopK``s, with the same values and indices.

onnxruntime's CPU ``TopK`` walks each row element by element (≈ 0.5 ns a token), while
``ReduceMax`` over a contiguous block is vectorised. With the vocabulary cut into n = ⌈V / B⌉
blocks of ``B`` consecutive tokens (the last padded with -inf when B does not divide V):

    blocks = ReduceMax(Reshape(log_probs, (rows, n, B)), -1)        (rows, n)     each block's best
    chosen = TopK(blocks, min(k, n))                                (rows, k)     the k best blocks…
    chosen = ascending(chosen)                                                    …in token order
    tokens = chosen · B + arange(B)                                 (rows, k·B)   their tokens
    top_log_probs, j = TopK(GatherElements(log_probs, tokens), k)
    top_tokens = GatherElements(tokens, j)

The k best tokens lie in the k blocks with the best maxima: a block left out has k chosen blocks
whose maxima beat its best token, or tie with it from lower token numbers (``TopK`` breaks ties
by the lower index, and blocks are runs of consecutive tokens), so its tokens are not among the
k best either. Gathered in token order, the candidates tie-break as the full ``TopK`` does: the
output is identical, ties included (tests/export/graphs/test_top_k_blocks.py).

It is faster at every vocabulary size served, a prime one padded to whole blocks included
(docs/decisions.md, "The CPU variants take their candidates by blocks of the vocabulary"). ``B`` is near
√V / 2, a divisor of V when one is close. Only the CPU variants' graphs are rewritten: the GPU's
``TopK`` is one kernel.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.graphs.external_data import save_checked
from export.graphs.onnx_tools import default_opset
from service.artefacts import LOG_PROBS, TOP_TOKENS

MIN_BLOCK, MAX_BLOCK = 8, 128
REDUCE_AXES_INPUT_OPSET = 18
BLOCK_SIZE = "top_k_block_size"  # the scalar initializer that names B (read back by block_size)


def choose_block(vocab: int) -> int | None:
    """B for a vocabulary of ``vocab`` tokens: near √vocab / 2 (log scale), a divisor of it within
    a factor of 2 of that when there is one (no padding), else that size itself; between
    MIN_BLOCK and MAX_BLOCK. None for a vocabulary of fewer than two minimal blocks."""
    if vocab < 2 * MIN_BLOCK:
        return None
    target = math.sqrt(vocab) / 2
    low, high = max(MIN_BLOCK, math.ceil(target / 2)), min(MAX_BLOCK, math.floor(target * 2))
    divisors = [b for b in range(low, high + 1) if vocab % b == 0]
    if divisors:
        return min(divisors, key=lambda b: abs(math.log(b / target)))
    return min(MAX_BLOCK, max(MIN_BLOCK, round(target)))


def block_top_k(path: Path, vocab: int) -> int | None:
    """Rewrite, in place, the ``TopK`` over ``log_probs`` that gives ``top_tokens`` in the decoder
    graph at ``path`` as the blocked selection above; returns ``B``, or None (graph unchanged)
    for a vocabulary too small for blocks. A vocabulary that B does not divide is padded with
    -inf to whole blocks first (never a candidate: a real token with -inf has a lower index)."""
    block = choose_block(vocab)
    if block is None:
        return None
    model = onnx.load(str(path))
    graph = model.graph
    top_k = next(n for n in graph.node if n.op_type == "TopK" and n.output[1] == TOP_TOKENS)
    if top_k.input[0] != LOG_PROBS:
        raise ValueError(f"{path}: the candidates' TopK reads {top_k.input[0]}, not {LOG_PROBS}")
    scores, k = top_k.input
    values, indices = top_k.output
    n_blocks = -(-vocab // block)
    padding = n_blocks * block - vocab
    p = "top_k_blocks/"
    constants = {
        f"{p}shape": np.array([0, n_blocks, block], dtype=np.int64),  # 0: the rows as they come
        f"{p}last": np.array([-1], dtype=np.int64),
        f"{p}n_blocks": np.array([n_blocks], dtype=np.int64),
        BLOCK_SIZE: np.array(block, dtype=np.int64),
        f"{p}offsets": np.arange(block, dtype=np.int64),
        f"{p}flat": np.array([0, -1], dtype=np.int64),
    }
    nodes = []
    if padding:  # the copy costs less than the single TopK it replaces
        constants[f"{p}pads"] = np.array([0, 0, 0, padding], dtype=np.int64)
        constants[f"{p}excluded"] = np.array(-np.inf, dtype=np.float32)
        nodes.append(helper.make_node("Pad", [scores, f"{p}pads", f"{p}excluded"], [f"{p}padded"]))
        scores = f"{p}padded"
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in constants.items())
    nodes += [
        helper.make_node("Reshape", [scores, f"{p}shape"], [f"{p}by_block"]),
        _reduce_max(f"{p}by_block", f"{p}last", f"{p}maxima", default_opset(model)),
        helper.make_node("Min", [k, f"{p}n_blocks"], [f"{p}k_blocks"]),
        helper.make_node("TopK", [f"{p}maxima", f"{p}k_blocks"], [f"{p}best", f"{p}chosen"], axis=-1),
        helper.make_node(  # the chosen blocks in token order: ties then break as the full TopK's
            "TopK", [f"{p}chosen", f"{p}k_blocks"], [f"{p}ascending", f"{p}unused"], axis=-1, largest=0
        ),
        helper.make_node("Unsqueeze", [f"{p}ascending", f"{p}last"], [f"{p}column"]),
        helper.make_node("Mul", [f"{p}column", BLOCK_SIZE], [f"{p}first"]),
        helper.make_node("Add", [f"{p}first", f"{p}offsets"], [f"{p}tokens_3d"]),
        helper.make_node("Reshape", [f"{p}tokens_3d", f"{p}flat"], [f"{p}tokens"]),
        helper.make_node("GatherElements", [scores, f"{p}tokens"], [f"{p}candidates"], axis=1),
        helper.make_node("TopK", [f"{p}candidates", k], [values, f"{p}best_candidates"], axis=-1),
        helper.make_node("GatherElements", [f"{p}tokens", f"{p}best_candidates"], [indices], axis=1),
    ]
    at = list(graph.node).index(top_k)
    rewritten = [*graph.node[:at], *nodes, *graph.node[at + 1 :]]
    del graph.node[:]
    graph.node.extend(rewritten)
    save_checked(model, path)
    return block


def _reduce_max(x: str, last: str, out: str, opset: int) -> onnx.NodeProto:
    """ReduceMax over the last axis, keepdims 0: axes are an input from opset 18, before it an
    attribute."""
    if opset >= REDUCE_AXES_INPUT_OPSET:
        return helper.make_node("ReduceMax", [x, last], [out], keepdims=0)
    return helper.make_node("ReduceMax", [x], [out], axes=[-1], keepdims=0)


def block_size(path: Path) -> int | None:
    """``B`` of a decoder graph rewritten by ``block_top_k``; None for a single ``TopK``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    tensor = next((t for t in graph.initializer if t.name == BLOCK_SIZE), None)
    return None if tensor is None else int(numpy_helper.to_array(tensor))
