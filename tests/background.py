"""What a test run does once for all its processes (pytest-xdist's workers, or the one process of
a plain run), in a folder they share:

- ``built_once``: a session artefact (a tiny trained model, an export) made by the first process
  that asks for it while the others wait on a lock, then read by all;
- ``BackgroundProcess``: a command (the image's build, the default models' export) started by the
  first process that asks, beside the tests that do not need it, and waited for by any process;
  the run's main process ends whatever still runs when the run ends (``stop_all``).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

POLL_S = 0.5


def is_worker() -> bool:
    """A pytest-xdist worker (its base temporary folder is one level below the run's)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def run_folder(base_temp: Path) -> Path:
    """The folder every process of this run shares, from the process's own base temporary folder."""
    return base_temp.parent if is_worker() else base_temp


def config_run_folder(config: pytest.Config) -> Path:
    """``run_folder`` in a hook, before any fixture (xdist finds the base folder the same way)."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return run_folder(factory.getbasetemp())


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Held by one process of the machine at a time (an advisory lock on the file ``lock``)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(folder)``'s result, made once in the run: by the first process that asks for
    ``name``, into a folder of the run's; the others wait for it, then read where it is."""
    folder = run_folder(tmp_path_factory.getbasetemp()) / "built" / name
    made = folder / "made"  # the result's path, written once it is complete
    with exclusive(folder.with_name(f"{name}.lock")):
        if not made.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            made.write_text(str(make(folder)))
    return Path(made.read_text())


# "$0": the state folder, "$@": the command. The wrapper leads a process group of its own, so
# that ending the group ends what the command started (podman, pip, the export).
_WRAPPER = '"$@" >"$0/output" 2>&1; echo $? >"$0/status.part"; mv "$0/status.part" "$0/status"'


class BackgroundProcess:
    """``command``, started now by the first process of the run (``run``: ``run_folder``) that asks
    for ``name``; its output and exit status are kept in the run's folder, so that any of its
    processes can wait for it."""

    def __init__(
        self, run: Path, name: str, command: list[str], cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        self.folder = folder = run / "background" / name
        with exclusive(folder.with_name(f"{name}.lock")):
            if not (folder / "pid").is_file():
                folder.mkdir(parents=True, exist_ok=True)
                process = subprocess.Popen(
                    ["bash", "-c", _WRAPPER, str(folder), *command],
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                _started_here.append(process)
                (folder / "pid").write_text(str(process.pid))
                (folder / "command").write_text(" ".join(command))
        self.started = (folder / "pid").stat().st_mtime

    def wait(self, timeout_s: float) -> tuple[int, str]:
        """Its exit status and the tail of its output, once it is over (``subprocess.TimeoutExpired``
        after ``timeout_s`` counted from its start)."""
        status = self.folder / "status"
        while not status.is_file():
            if time.time() - self.started > timeout_s:
                raise subprocess.TimeoutExpired((self.folder / "command").read_text(), timeout_s)
            _reap()
            time.sleep(POLL_S)
        code = int(status.read_text())
        return code, (self.folder / "output").read_text(errors="replace")[-10000:]


_started_here: list[subprocess.Popen[bytes]] = []  # this process's children, reaped when they end


def _reap() -> None:
    for process in _started_here:
        process.poll()


def stop_all(config: pytest.Config) -> None:
    """At the end of the run, in its main process: every background command of the run that still
    runs is ended with its process group (a run cut short leaves nothing behind)."""
    _reap()
    if is_worker():
        return
    for pid_file in (config_run_folder(config) / "background").glob("*/pid"):
        if (pid_file.parent / "status").is_file():
            continue
        group = int(pid_file.read_text())
        for sig, grace_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _group_alive(group):
                _reap()
                time.sleep(POLL_S)
            if not _group_alive(group):
                break
    _reap()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
