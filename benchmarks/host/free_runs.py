"""onnxruntime runs made free: a session's ``run`` and ``run_with_iobinding`` answer at once with
outputs of the right names, shapes and dtypes, so that what is left of a timed request is the host
side around the graphs: what a GPU, whose compute is nearly free, leaves the service to do.

``FreeRuns`` is the ``host`` stage's one session patcher: it patches sessions in place (the engine
keeps calling the same objects, of onnxruntime's own class), counts their runs by kind, and can
make each session report a provider first (``provider``), so that an engine takes that provider's
code path (a device's sub-batch cut, its decoder layout's IO binding) while the arrays stay on the
host. ``FreeRuns.made_free`` patches every session onnxruntime makes inside it, whoever makes it
(an engine's graphs, the sessions it makes later on, as the device's cache moves), each with the
kind and outputs its ``Choose`` picks from the session and its model. Outputs are synthetic
(``translation.py``'s) or recorded from a real run and replayed (``replay.py``).

IO bindings are recorded by a ``RecordedBinding`` that also forwards each bind to the real
binding where the device exists, so binding costs what it costs; what the session allocates is
an OrtValue owning its memory, as a run's outputs are; outputs whose values nobody reads
(``Unwritten``: a cache, the memory) are allocated and left unwritten, and a cache bound to the
caller's buffers (written in place by the graph) is left alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
# (a session just made, the model it was made from: a path or the model's bytes) → (its kind, its
# outputs); called before the session is patched, so that it may keep the session's real ``run``
Choose = Callable[[ort.InferenceSession, "str | bytes"], tuple[str, Outputs]]


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

    def bind_input(self, name: str, device_type: str, device_id: int, *address: Any) -> None:
        """An input bound by its address (a device buffer the caller holds): recorded as given."""
        self.inputs[name] = address
        if self.forward is not None:
            self.forward.bind_input(name, device_type, device_id, *address)

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
    """Sessions whose runs cost nothing, and how many runs each kind made. ``provider``: the
    provider each patched session reports first (None: its real ones)."""

    def __init__(self, forward_bindings: bool = True, provider: str | None = None) -> None:
        self.forward_bindings = forward_bindings
        self.provider = provider
        self.runs: Counter[str] = Counter()

    @contextmanager
    def made_free(self, choose: Choose) -> Iterator[None]:
        """Every ``onnxruntime.InferenceSession`` made inside the block is patched with the kind
        and outputs ``choose`` picks for it; its runs stay free after the block."""
        real = ort.InferenceSession

        def made(model: str | bytes, *args: Any, **kwargs: Any) -> ort.InferenceSession:
            session = real(model, *args, **kwargs)
            self.patch(session, *choose(session, model))
            return session

        ort.InferenceSession = made
        try:
            yield
        finally:
            ort.InferenceSession = real

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
            binding.results = [
                _bound(name, bound, made.get(name), binding.inputs) for name, bound in binding.outputs.items()
            ]

        session.run = run
        session.io_binding = io_binding
        session.run_with_iobinding = run_with_iobinding
        if self.provider is not None:
            reported = [self.provider, *(p for p in session.get_providers() if p != self.provider)]
            session.get_providers = lambda: list(reported)


def _bound(name: str, bound: Any, value: np.ndarray | Unwritten | None, inputs: Feeds) -> ort.OrtValue:
    """An IO-bound output after a free run: the caller's OrtValue, written where the value is
    read; else one the run allocates (an input's OrtValue where the output may reuse it)."""
    stand_in = inputs.get(value.reuse) if isinstance(value, Unwritten) and value.reuse else None
    if bound is None and isinstance(stand_in, ort.OrtValue):
        return stand_in
    if bound is None:  # the run allocates it: an OrtValue owning its memory, as a run's
        if value is None:
            raise KeyError(f"the free run made no {name!r}")
        bound = ort.OrtValue.ortvalue_from_shape_and_type(
            list(value.shape), np.dtype(value.dtype).type, "cpu"
        )
    if isinstance(value, np.ndarray):
        bound.update_inplace(np.ascontiguousarray(value))
    return bound


def _array(value: np.ndarray | Unwritten) -> np.ndarray:
    return np.empty(value.shape, dtype=value.dtype) if isinstance(value, Unwritten) else value
