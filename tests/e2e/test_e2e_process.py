"""The running service process, serving the real models, never loaded torch.

tests/service/api/test_api_startup.py checks the imports; this checks the live process itself,
after it has served both models: none of torch's shared libraries is mapped into it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps"),
]

TORCH_LIBRARY = re.compile(r"/lib(torch\w*|c10\w*|shm)\.so")


def mapped_files(pid: int) -> set[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {fields[5] for line in lines if len(fields := line.split(maxsplit=5)) == 6}


def test_the_serving_process_never_mapped_torch(client: httpx.Client, service: ServerProcess) -> None:
    assert client.post("/v1/translate", json={"text": "A dog runs."}).status_code == 200
    assert client.post("/v1/embed", json={"texts": ["A dog runs."]}).status_code == 200
    files = mapped_files(service.proc.pid)
    assert any("onnxruntime" in f for f in files), "onnxruntime is not mapped: not the serving process?"
    assert not [f for f in files if TORCH_LIBRARY.search(f) or "/torch/" in f]
