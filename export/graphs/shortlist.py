"""The decoder step over a vocabulary shortlist (CTranslate2's ``vmap``): ``decoder_shortlist.onnx``.

A translation artefact exported with a vocabulary map (``python -m export SOURCE --vmap FILE``)
carries, beside ``decoder.onnx``, this rewrite of it. Two inputs are added:

* ``vocabulary`` int64 (vocab,): the target tokens the running rows may produce, ascending
  (the union of their sentences' shortlists, service/engine/translation/shortlist.py);
* ``vocabulary_mask`` bool (batch, vocab): where a row's own sentence allows the token, so each
  row is scored over its own sentence's shortlist only.

and the step's tail becomes

    W_v = Transpose(Gather(Wᵀ, vocabulary))          (d_model, vocab)   the output projection's columns
    logits = h · W_v (+ Gather(bias, vocabulary))    (batch, vocab)
    log_probs = LogSoftmax(Where(vocabulary_mask, Cast(logits, float64), -inf))   back to float32
    top_log_probs, j = TopK(log_probs, top_k);  top_tokens = Gather(vocabulary, j)

so the projection, log-softmax and top-k run over the shortlist and the search still reads
full-vocabulary token ids. The projection's weight is stored transposed, one row a token: the
rows gather as contiguous blocks (gathering the columns of the weight instead was several times
slower than a row gather and a transpose). int8 graphs gather the per-column
weight scales alike; the row's activation scale does not depend on the vocabulary, and the
integer product is exact, so a kept logit is bit-identical to the full decoder's.

Why float64 for the log-softmax: the masked entries add exact zeros to its sum, but where a
row's tokens sit in the union changes how a vectorised float32 sum groups them, and so the last
bit of a row's scores would change with what shares its step. Summed in float64 and rounded to
float32, they do not (up to a float64 sum landing on a float32 rounding boundary).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.graphs.external_data import save_checked
from service.artefacts import LOG_PROBS, TOP_TOKENS, VOCABULARY, VOCABULARY_MASK

SHORTLIST_DECODER = "decoder_shortlist.onnx"
_PROJECTIONS = ("MatMul", "MatMulIntegerToFloat")
_ON_THE_WAY = ("Cast", "Add")  # between the projection and the log-softmax: the bias, a cast


def shortlist_decoder(decoder: Path, out: Path) -> None:
    """Write the shortlist form of the decoder graph at ``decoder`` (a ``*_top_k`` or slot layout:
    one whose ``top_tokens`` come from a ``TopK`` over ``log_probs``) to ``out``."""
    model = onnx.load(str(decoder))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    initializers = {t.name: t for t in graph.initializer}
    log_softmax = producer[LOG_PROBS]
    if log_softmax.op_type != "LogSoftmax":
        raise ValueError(f"{decoder}: {LOG_PROBS} comes from {log_softmax.op_type}, not LogSoftmax")
    tail, name = [], log_softmax.input[0]
    while producer[name].op_type in _ON_THE_WAY:
        tail.append(producer[name])
        name = producer[name].input[0]
    projection = producer[name]
    if projection.op_type not in _PROJECTIONS or projection.input[1] not in initializers:
        raise ValueError(f"{decoder}: no output projection with a constant weight before the log-softmax")
    top_k = next((n for n in graph.node if n.op_type == "TopK" and n.input[0] == LOG_PROBS), None)
    if top_k is None or top_k.output[1] != TOP_TOKENS:
        raise ValueError(f"{decoder}: no TopK over {LOG_PROBS} giving {TOP_TOKENS}")
    weight = initializers[projection.input[1]]
    vocab = weight.dims[1]
    before: dict[str, list[onnx.NodeProto]] = {}  # new nodes, by the output of the node they precede

    def gather(x: str, axis: int, out: str, consumer: onnx.NodeProto) -> str:
        before.setdefault(consumer.output[0], []).append(
            helper.make_node("Gather", [x, VOCABULARY], [out], axis=axis)
        )
        return out

    by_token = numpy_helper.from_array(
        np.ascontiguousarray(numpy_helper.to_array(weight).T), f"{weight.name}_by_token"
    )
    graph.initializer.remove(weight)
    graph.initializer.append(by_token)
    rows = gather(by_token.name, 0, "shortlist_weight_rows", projection)
    before[projection.output[0]].append(
        helper.make_node("Transpose", [rows], ["shortlist_weight"], perm=[1, 0])
    )
    projection.input[1] = "shortlist_weight"
    if projection.op_type == "MatMulIntegerToFloat":  # its per-column weight scales
        projection.input[3] = gather(projection.input[3], 0, "shortlist_weight_scale", projection)
    for node in tail:
        for i, x in enumerate(node.input):
            dims = _constant_dims(x, initializers, producer)
            if node.op_type == "Add" and dims and dims[-1] == vocab:  # the output bias
                node.input[i] = gather(x, len(dims) - 1, f"shortlist_bias_{i}", node)
    excluded = helper.make_tensor("shortlist_excluded", TensorProto.DOUBLE, [], [-np.inf])
    graph.initializer.append(excluded)
    masked_log_softmax = [
        helper.make_node("Cast", [log_softmax.input[0]], ["shortlist_logits"], to=TensorProto.DOUBLE),
        helper.make_node("Where", [VOCABULARY_MASK, "shortlist_logits", excluded.name], ["shortlist_masked"]),
        helper.make_node("LogSoftmax", ["shortlist_masked"], ["shortlist_log_probs"], axis=-1),
        helper.make_node("Cast", ["shortlist_log_probs"], [LOG_PROBS], to=TensorProto.FLOAT),
    ]
    top_k.output[1] = "shortlist_top"
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:  # in graph order, each new node right where its inputs are ready
        if node.output[0] == LOG_PROBS:
            nodes += masked_log_softmax
            continue
        nodes += [*before.get(node.output[0], []), node]
        if node.output[0] == top_k.output[0]:
            nodes.append(helper.make_node("Gather", [VOCABULARY, "shortlist_top"], [TOP_TOKENS], axis=0))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.extend(
        [
            helper.make_tensor_value_info(VOCABULARY, TensorProto.INT64, ["vocab"]),
            helper.make_tensor_value_info(VOCABULARY_MASK, TensorProto.BOOL, ["batch", "vocab"]),
        ]
    )
    for output in graph.output:
        if output.name == LOG_PROBS:
            output.type.tensor_type.shape.dim[1].dim_param = "vocab"
    save_checked(model, out)


def _constant_dims(
    name: str, initializers: dict[str, onnx.TensorProto], producer: dict[str, onnx.NodeProto]
) -> list[int] | None:
    """The shape of a constant (an initializer or a ``Constant`` node's tensor), else None."""
    if name in initializers:
        return list(initializers[name].dims)
    node = producer.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute[0].name == "value":
        return list(node.attribute[0].t.dims)
    return None
