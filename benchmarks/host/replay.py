"""Sessions whose compute is free: each onnxruntime session's ``run`` answered from a captured output.

What the ``host`` stage measures is everything around the graphs (tokenizer, pooling, queue,
HTTP, serialisation), which a real model's compute would hide on this CPU and which is all that
is left of a request's time on a GPU. :class:`ReplaySession` wraps a real session: the first run
of each set of outputs runs the graph and keeps its outputs; every later run returns them again,
resized to the feeds' shapes along the graph's symbolic dimensions (``batch``, ``sequence``), so
the engine gets arrays of the shapes and dtypes the graph would give. ``provider`` makes the
session report that provider first, so that an engine takes its device code path (its sub-batch
cut, its batch limits) while the arrays stay on the host. Sessions driven through IO binding
(the translator's device backend) are not replayed.

``python -m benchmarks.host.replay`` is ``python -m service`` with every session replayed, the
provider it reports named by ``HOST_REPLAY_PROVIDER`` (default: the real one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnxruntime as ort

PROVIDER_VARIABLE = "HOST_REPLAY_PROVIDER"


class ReplaySession:
    """A real session whose ``run`` replays its first answer per set of outputs (see the module)."""

    def __init__(self, session: ort.InferenceSession, provider: str | None = None) -> None:
        self._session = session
        real = list(session.get_providers())
        self._providers = [provider, *(p for p in real if p != provider)] if provider else real
        self._output_dims = {o.name: o.shape for o in session.get_outputs()}
        self._input_dims = {i.name: i.shape for i in session.get_inputs()}
        self._captured: dict[tuple[str, ...], list[np.ndarray]] = {}
        self.runs = 0  # runs answered, captured or replayed

    def __getattr__(self, name: str) -> Any:  # everything but run and the providers is the real session's
        return getattr(self._session, name)

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, np.ndarray], run_options: Any = None
    ) -> list[np.ndarray]:
        self.runs += 1
        names = tuple(output_names or self._output_dims)
        captured = self._captured.get(names)
        if captured is None:
            captured = self._captured[names] = list(self._session.run(list(names), dict(feeds), run_options))
        sizes = self._symbol_sizes(feeds)
        return [_fit(out, self._output_dims[name], sizes) for name, out in zip(names, captured, strict=True)]

    def _symbol_sizes(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each symbolic input dimension's size in these feeds (``batch`` → 128, …)."""
        sizes: dict[str, int] = {}
        for name, array in feeds.items():
            for dim, size in zip(self._input_dims.get(name, ()), np.shape(array), strict=False):
                if isinstance(dim, str):
                    sizes[dim] = int(size)
        return sizes


def _fit(captured: np.ndarray, dims: Sequence[Any], sizes: Mapping[str, int]) -> np.ndarray:
    """``captured`` resized along its symbolic dimensions, its rows repeated where the feeds are
    larger: a fresh array, as a real run returns."""
    out = captured
    for axis, dim in enumerate(dims):
        if isinstance(dim, str) and dim in sizes and sizes[dim] != out.shape[axis]:
            out = np.take(out, np.arange(sizes[dim]), axis=axis, mode="wrap")
    return out.copy() if out is captured else out


@contextmanager
def replaying(provider: str | None = None) -> Iterator[list[ReplaySession]]:
    """Every ``onnxruntime.InferenceSession`` made inside is a :class:`ReplaySession` reporting
    ``provider``; yields the sessions made."""
    real = ort.InferenceSession
    made: list[ReplaySession] = []

    def replayed(*args: Any, **kwargs: Any) -> ReplaySession:
        made.append(ReplaySession(real(*args, **kwargs), provider))
        return made[-1]

    ort.InferenceSession = replayed
    try:
        yield made
    finally:
        ort.InferenceSession = real


def main() -> int:
    from service.__main__ import main as serve

    with replaying(os.environ.get(PROVIDER_VARIABLE) or None):
        return serve()


if __name__ == "__main__":
    sys.exit(main())
