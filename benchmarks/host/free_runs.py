"""onnxruntime runs made free: a session's ``run`` and ``run_with_iobinding`` answer at once with
outputs of the right names, shapes and dtypes, so that what is left of a timed decode is the host
side around the graphs: what a GPU, whose compute is nearly free, leaves the service to do.

``FreeRuns`` patches live sessions in place (the engine keeps calling the same objects) and counts
their runs. IO bindings are recorded by a ``RecordedBinding`` that also forwards each bind to the
real binding where the device exists, so binding costs what it costs; what the session allocates is an
OrtValue owning its memory, as a run's outputs are; outputs whose values nobody reads
(``Unwritten``: a cache, the memory) are allocated and left unwritten, and a cache bound to the
caller's buffers (written in place by the graph) is left alone. Each session's outputs come from
its ``Outputs`` function.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

Feeds = dict[str, Any]  # name → np.ndarray or ort.OrtValue


@dataclass(frozen=True)
class Unwritten:
    """An output whose values nobody reads (a cache, the memory): allocated, never written."""

    shape: tuple[int, ...]
    dtype: type[np.generic]
    # an input whose OrtValue may stand for it: nothing is written, so a cache's output can be its
    # input's memory, as a real run's allocation from its arena costs the host next to nothing
    reuse: str | None = None


# (wanted output names, the run's inputs) → {name: its values or ``Unwritten``}: the run's answer
Outputs = Callable[[list[str], Feeds], dict[str, "np.ndarray | Unwritten"]]


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(x.shape()) if isinstance(x, ort.OrtValue) else tuple(np.shape(x))


class RecordedBinding:
    """An IO binding that remembers what was bound; ``forward`` is the real binding, or None where
    the device it names does not exist here (a CUDA layout replayed on a CPU)."""

    def __init__(self, forward: ort.IOBinding | None) -> None:
        self.forward = forward
        self.inputs: Feeds = {}
        self.outputs: dict[str, Any] = {}  # name → a bound OrtValue, or None: allocated by the run
        self.results: list[ort.OrtValue] = []

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self.inputs[name] = array
        if self.forward is not None:
            self.forward.bind_cpu_input(name, array)

    def bind_ortvalue_input(self, name: str, value: ort.OrtValue) -> None:
        self.inputs[name] = value
        if self.forward is not None:
            self.forward.bind_ortvalue_input(name, value)

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0) -> None:
        self.outputs[name] = None
        if self.forward is not None:
            self.forward.bind_output(name, device_type, device_id)

    def bind_ortvalue_output(self, name: str, value: ort.OrtValue) -> None:
        self.outputs[name] = value
        if self.forward is not None:
            self.forward.bind_ortvalue_output(name, value)

    def clear_binding_outputs(self) -> None:
        self.outputs = {}
        if self.forward is not None:
            self.forward.clear_binding_outputs()

    def get_outputs(self) -> list[ort.OrtValue]:
        return self.results


class FreeRuns:
    """Sessions whose runs cost nothing, and how many runs each kind made."""

    def __init__(self, forward_bindings: bool = True) -> None:
        self.forward_bindings = forward_bindings
        self.runs: Counter[str] = Counter()

    def patch(self, session: ort.InferenceSession, kind: str, outputs: Outputs) -> None:
        """``session``'s runs answer with ``outputs``, counted under ``kind``."""
        real_binding = session.io_binding

        def run(names: list[str] | None, feeds: Feeds, *_: Any, **__: Any) -> list[np.ndarray]:
            self.runs[kind] += 1
            wanted = names or [o.name for o in session.get_outputs()]
            made = outputs(wanted, feeds)
            return [_array(made[name]) for name in wanted]

        def io_binding() -> RecordedBinding:
            return RecordedBinding(real_binding() if self.forward_bindings else None)

        def run_with_iobinding(binding: RecordedBinding, *_: Any) -> None:
            self.runs[kind] += 1
            made = outputs(list(binding.outputs), binding.inputs)
            results = []
            for name, bound in binding.outputs.items():
                value = made.get(name)
                stand_in = (
                    binding.inputs.get(value.reuse) if isinstance(value, Unwritten) and value.reuse else None
                )
                if bound is None and isinstance(stand_in, ort.OrtValue):
                    results.append(stand_in)
                    continue
                if bound is None:  # the run allocates it: an OrtValue owning its memory, as a run's
                    assert value is not None, name
                    bound = ort.OrtValue.ortvalue_from_shape_and_type(
                        list(value.shape), np.dtype(value.dtype).type, "cpu"
                    )
                if isinstance(value, np.ndarray):
                    bound.update_inplace(np.ascontiguousarray(value))
                results.append(bound)
            binding.results = results

        session.run = run  # type: ignore[method-assign]
        session.io_binding = io_binding  # type: ignore[method-assign]
        session.run_with_iobinding = run_with_iobinding  # type: ignore[method-assign]


def _array(value: np.ndarray | Unwritten) -> np.ndarray:
    return np.empty(value.shape, dtype=value.dtype) if isinstance(value, Unwritten) else value
