"""Graphs over protobuf's 2 GiB: ONNX's external data format, and the one place that decides it.

A graph is one file while its initializers hold at most ``EXTERNAL_DATA_THRESHOLD`` bytes (every
default model, byte for byte as before), and above that ``<graph>.onnx`` with its initializers in
one external data file beside it, ``<graph>.onnx.data``, which onnxruntime reads from the graph's
directory: protobuf cannot serialise a message over 2 GiB, and NLLB-600M's decoder holds about
3 GB of weights. Every export step that writes a graph saves it through :func:`save_graph` (or
:func:`save_fused`, onnxruntime's own save), and the manifest lists the data files beside their
graphs (:func:`graph_files`), each verified by its sha256 like every file of an artefact.

Tensors under ``INLINE_TENSOR_BYTES`` (shapes, indices, scalars) stay in the graph file, so passes
that serialise the model (onnx's version converter, shape inference) can run on the graph loaded
without its data (export/graphs/int8_rowwise.py).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:  # onnxruntime's transformer tools are imported by their callers
    from onnxruntime.transformers.onnx_model import OnnxModel

# 1 GiB: half of protobuf's 2 GiB limit, a margin for what a graph holds beside its initializers
# (Constant nodes, the nodes themselves) and for the tensors a rewrite adds before it is saved
# again. The default models stay far below it (single files, as before); tests lower it.
EXTERNAL_DATA_THRESHOLD = 1 << 30
EXTERNAL_DATA_SUFFIX = ".data"
INLINE_TENSOR_BYTES = 1024  # smaller tensors (shapes, scalars) stay in the graph file, readable alone


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The size of the model's initializers, whether their data is in memory or external."""
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in model.graph.initializer
    )


def data_file(path: Path) -> Path:
    """Where :func:`save_graph` puts the initializers of a large graph at ``path``."""
    return path.with_name(path.name + EXTERNAL_DATA_SUFFIX)


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s initializers are over ``EXTERNAL_DATA_THRESHOLD``: saved with a data file."""
    return initializer_bytes(model) > EXTERNAL_DATA_THRESHOLD


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` (its tensors' data in memory) to ``path``: one file up to
    ``EXTERNAL_DATA_THRESHOLD`` bytes of initializers, else the graph and ``<path>.data`` holding
    every tensor of ``INLINE_TENSOR_BYTES`` or more. A data file left by an earlier save is
    removed first (onnx appends to an existing one). The model's tensors are external afterwards
    when it went to a data file: load it again to read them."""
    if any(_external(t) for t in model.graph.initializer):
        raise ValueError(f"{path}: the model to save still refers to external data; load it with its data")
    data = data_file(path)
    data.unlink(missing_ok=True)
    if not needs_external_data(model):
        onnx.save(model, str(path))
        return
    for tensor in model.graph.initializer:  # onnx moves only raw_data out, not float_data & co.
        if not tensor.HasField("raw_data"):
            tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=INLINE_TENSOR_BYTES,
    )
    readable_like_its_graph(path)


def readable_like_its_graph(path: Path) -> None:
    """Give the graph's data file (if any) the graph's permissions: onnx creates it 0600, which
    would hide a published artefact's weights from the service's user."""
    data = data_file(path)
    if data.exists():
        data.chmod(path.stat().st_mode & 0o777)


def save_checked(model: onnx.ModelProto, path: Path) -> None:
    """:func:`save_graph`, then the ONNX checker on the written file (from its path, which works
    for a graph with external data, where checking the message itself cannot)."""
    save_graph(model, path)
    onnx.checker.check_model(str(path))


def graph_files(directory: Path, graph: str) -> list[str]:
    """``graph`` (relative to ``directory``) and the external data files its tensors read, as
    relative POSIX paths: what the manifest must list for the graph to be verified whole."""
    model = onnx.load(str(directory / graph), load_external_data=False)
    parent = Path(graph).parent
    locations = {
        (parent / onnx.external_data_helper.ExternalDataInfo(t).location).as_posix()
        for t in model.graph.initializer  # save_graph leaves Constant nodes' tensors in the graph
        if _external(t)
    }
    return [graph, *sorted(locations)]


def _external(tensor: onnx.TensorProto) -> bool:
    return onnx.external_data_helper.uses_external_data(tensor)


def copy_graph(source: Path, target: Path) -> None:
    """Copy the graph at ``source`` and the external data files it reads to ``target``'s
    directory; the data keeps its file name, which the graph refers to (in the same directory,
    both graphs read the one data file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    if target.parent.resolve() != source.parent.resolve():
        for name in graph_files(source.parent, source.name)[1:]:
            shutil.copyfile(source.parent / name, target.parent / name)


def save_fused(model: OnnxModel, path: Path) -> None:
    """onnxruntime's own save of its ``OnnxModel`` (it adds the com.microsoft opset its fused
    nodes need), in :func:`save_graph`'s format: the same threshold, data file and permissions."""
    data_file(path).unlink(missing_ok=True)  # its data is in memory; onnx would append to it
    model.save_model_to_file(str(path), use_external_data_format=needs_external_data(model.model))
    readable_like_its_graph(path)
