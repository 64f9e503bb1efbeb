"""Recorded outputs for free sessions (``free_runs.py``), and the service with every session replayed.

What the ``host`` stage measures of the embedding service is everything around its graph
(tokenizer, queue, HTTP, serialisation), which a real model's compute would hide on this CPU and
which is all that is left of a request's time on a GPU. :func:`recorded` is the ``Outputs`` of a
session that computes once: the first run of each set of outputs runs the graph and keeps its
outputs; every later run returns them again, resized to the feeds' shapes along the graph's
symbolic dimensions (``batch``, ``sequence``), so the engine gets arrays of the shapes and dtypes
the graph would give.

``python -m benchmarks.host.replay`` is ``python -m service`` with every session replayed, the
provider it reports named by ``HOST_REPLAY_PROVIDER`` (default: the real one); with
``TSERVE_WORKERS`` > 1 each serving process replays its own.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.host.free_runs import Feeds, FreeRuns, Outputs, Unwritten
from service.__main__ import main as serve_one
from service.__main__ import prepare_process
from service.__main__ import serve_process as serve_one_of_several
from service.http.workers import Peers, run_workers
from service.settings import Settings

PROVIDER_VARIABLE = "HOST_REPLAY_PROVIDER"
KIND = "replayed"  # the kind every replayed session's runs are counted under


def recorded(session: ort.InferenceSession) -> Outputs:
    """``session``'s outputs, computed by its real ``run`` once per set of outputs and replayed
    at the shapes the feeds ask for (take it before the session is patched)."""
    real_run = session.run
    output_dims = {o.name: o.shape for o in session.get_outputs()}
    input_dims = {i.name: i.shape for i in session.get_inputs()}
    captured: dict[tuple[str, ...], list[np.ndarray]] = {}

    def outputs(names: list[str], feeds: Feeds) -> dict[str, np.ndarray | Unwritten]:
        key = tuple(names)
        if key not in captured:
            arrays = {k: v.numpy() if isinstance(v, ort.OrtValue) else v for k, v in feeds.items()}
            captured[key] = list(real_run(names, arrays))
        sizes = _symbol_sizes(input_dims, feeds)
        return {
            name: _fit(out, output_dims[name], sizes) for name, out in zip(names, captured[key], strict=True)
        }

    return outputs


def _symbol_sizes(input_dims: Mapping[str, Sequence[Any]], feeds: Feeds) -> dict[str, int]:
    """Each symbolic input dimension's size in these feeds (``batch`` → 128, …)."""
    sizes: dict[str, int] = {}
    for name, value in feeds.items():
        shape = value.shape() if isinstance(value, ort.OrtValue) else np.shape(value)
        for dim, size in zip(input_dims.get(name, ()), shape, strict=False):
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
def replaying(provider: str | None = None) -> Iterator[FreeRuns]:
    """Every session made inside replays its recorded outputs (counted under ``KIND``), reporting
    ``provider`` first; yields their ``FreeRuns``."""
    runs = FreeRuns(provider=provider)
    with runs.made_free(lambda session, _: (KIND, recorded(session))):
        yield runs


def serve_process(listener: socket.socket, peers: Peers) -> None:
    """One of ``TSERVE_WORKERS`` serving processes (``service.http.workers``), its sessions replayed."""
    with replaying(os.environ.get(PROVIDER_VARIABLE) or None):
        serve_one_of_several(listener, peers)


def main() -> int:
    settings = Settings()
    if settings.workers > 1:  # the parent makes no session: each process replays its own
        prepare_process(settings)
        return run_workers(settings, f"benchmarks.host.replay:{serve_process.__name__}")
    with replaying(os.environ.get(PROVIDER_VARIABLE) or None):
        return serve_one()


if __name__ == "__main__":
    sys.exit(main())
