"""Stacked (n_layers, …) graph inputs and outputs turned into one per layer, so a decoder step
neither copies each layer's slice out of a stacked cache nor stacks its outputs again."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from export.graphs.external_data import save_checked
from service.artefacts import per_layer


def unstack_layers(path: Path, inputs: Sequence[str], outputs: Sequence[str]) -> int:
    """Turn stacked (n_layers, …) graph inputs and outputs into one per layer, in place: input
    ``x`` becomes ``x_0`` … ``x_{n-1}`` and output ``y`` (a ``Concat`` of ``Unsqueeze``d layer
    tensors, as ``torch.stack`` exports) becomes ``y_0`` …, so a step no longer copies every
    layer's slice out of a stacked input (onnxruntime's Gather → Split) nor stacks the outputs.

    A stacked input may only be indexed by constant layer (``Gather`` axis 0) or read by
    ``Shape`` (fed from a rank-preserving view of layer 0: every axis but the first keeps its
    size). Returns the number of layers; raises ``ValueError`` on any other structure."""
    model = onnx.load(str(path))
    graph = model.graph
    unstacking = _Unstacking(path)
    n_layers = unstacking.read_inputs(graph, inputs)
    new_outputs = unstacking.read_outputs(graph, outputs, n_layers)
    for node in unstacking.dropped:
        graph.node.remove(node)
    for node in graph.node:
        for j, x in enumerate(node.input):
            node.input[j] = unstacking.renamed.get(x, x)
        for j, x in enumerate(node.output):
            node.output[j] = unstacking.renamed.get(x, x)
    declared = {v.name: v for v in graph.output}
    for name in outputs:
        graph.output.remove(declared[name])
    graph.output.extend(new_outputs)
    stacked = {v.name: v for v in graph.input if v.name in inputs}
    for name in inputs:
        graph.input.remove(stacked[name])
        graph.input.extend(_per_layer_values(stacked[name], n_layers))
    _view_layer_zero(graph, unstacking.shape_readers, inputs)
    _drop_unused_constants(graph)
    save_checked(model, path)
    return n_layers


class _Unstacking:
    """What ``unstack_layers`` rewrites: the tensors renamed to their per-layer names, the nodes
    that stacked or unstacked the layers, and the ``Shape`` nodes reading a stacked input."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.renamed: dict[str, str] = {}
        self.dropped: list[onnx.NodeProto] = []
        self.shape_readers: list[onnx.NodeProto] = []

    def read_inputs(self, graph: onnx.GraphProto, inputs: Sequence[str]) -> int:
        """Each stacked input's per-layer ``Gather`` by a constant index; the number of layers."""
        constants = _small_constants(graph)
        layers: dict[str, set[int]] = {name: set() for name in inputs}
        for node in graph.node:
            for name in set(node.input) & set(inputs):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                by_layer = node.op_type == "Gather" and node.input[0] == name and axis == 0
                if by_layer and node.input[1] in constants:
                    index = constants[node.input[1]]
                    if index.ndim != 0:
                        raise ValueError(f"{self.path}: {node.name} indexes {name} with a non-scalar")
                    self.renamed[node.output[0]] = per_layer(name, int(index))
                    layers[name].add(int(index))
                    self.dropped.append(node)
                elif node.op_type == "Shape":
                    self.shape_readers.append(node)
                else:
                    raise ValueError(
                        f"{self.path}: {node.op_type} {node.name} reads stacked {name} as a whole"
                    )
        n_layers = len(layers[inputs[0]])
        if any(found != set(range(n_layers)) for found in layers.values()):
            raise ValueError(f"{self.path}: stacked inputs are not indexed by every layer: {layers}")
        return n_layers

    def read_outputs(
        self, graph: onnx.GraphProto, outputs: Sequence[str], n_layers: int
    ) -> list[onnx.ValueInfoProto]:
        """Each stacked output's ``Concat`` of ``Unsqueeze``d layers; the per-layer outputs."""
        producers = {out: node for node in graph.node for out in node.output}
        declared = {v.name: v for v in graph.output}
        new_outputs = []
        for name in outputs:
            stack = producers[name]
            if stack.op_type != "Concat" or len(stack.input) != n_layers:
                raise ValueError(f"{self.path}: output {name} is not a Concat of {n_layers} layers")
            for i, unsqueezed in enumerate(stack.input):
                unsqueeze = producers[unsqueezed]
                if unsqueeze.op_type != "Unsqueeze":
                    raise ValueError(
                        f"{self.path}: output {name} stacks a {unsqueeze.op_type}, not an Unsqueeze"
                    )
                self.renamed[unsqueeze.input[0]] = per_layer(name, i)
                self.dropped.append(unsqueeze)
            new_outputs += _per_layer_values(declared[name], n_layers)
            self.dropped.append(stack)
        return new_outputs


def _small_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The graph's one-element constants (the layer indices among them); a large graph's weights
    are not copied."""
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer if math.prod(t.dims) <= 1}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
    return constants


def _per_layer_values(stacked: onnx.ValueInfoProto, n_layers: int) -> list[onnx.ValueInfoProto]:
    """``x_0`` … ``x_{n-1}``: the stacked value's type without its layer axis."""
    elem = stacked.type.tensor_type.elem_type
    dims = [d.dim_param or d.dim_value for d in stacked.type.tensor_type.shape.dim][1:]
    return [onnx.helper.make_tensor_value_info(f"{stacked.name}_{i}", elem, dims) for i in range(n_layers)]


def _view_layer_zero(
    graph: onnx.GraphProto, shape_readers: list[onnx.NodeProto], inputs: Sequence[str]
) -> None:
    """Feed each ``Shape`` of a stacked input from layer 0 with a leading axis of 1 put back."""
    axis_zero = "unstack_layers_axis0"
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), axis_zero))
    for node in shape_readers:
        for j, x in enumerate(node.input):
            if x in inputs:
                view = f"{x}_view"
                if not any(n.output[0] == view for n in graph.node):
                    graph.node.insert(0, onnx.helper.make_node("Unsqueeze", [f"{x}_0", axis_zero], [view]))
                node.input[j] = view


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    """Remove the layer-index constants and initializers nothing reads any more."""
    used = {x for node in graph.node for x in node.input} | {v.name for v in graph.output}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        graph.node.remove(node)
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
