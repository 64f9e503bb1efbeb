"""A command the test session starts early and waits for late: the image's build and the default
models' export run in processes of their own beside the tests that do not need them."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path


class BackgroundProcess:
    """``command`` started now, its output kept in a temporary file until ``stop``."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.started = time.monotonic()
        self._output = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the process's lifetime; stop closes it)
        self._process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=self._output, stderr=subprocess.STDOUT, text=True
        )

    def wait(self, timeout_s: float) -> tuple[int, str]:
        """Its exit status and the tail of its output, once it is over (``subprocess.TimeoutExpired``
        after ``timeout_s`` counted from its start)."""
        code = self._process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - self.started)))
        self._output.seek(0)
        return code, self._output.read()[-10000:]

    def stop(self) -> None:
        """Ended, if it still runs (a session cut short leaves nothing behind), and its output freed."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._output.close()
