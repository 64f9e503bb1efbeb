"""A py-spy profile of a server process while a load runs, and its summary.

    py-spy record --format raw --rate 200 --threads --nonblocking --duration N --pid PID -o FILE

``--nonblocking`` reads the process's memory without stopping it, so the load it serves is not
slowed by pauses; py-spy records the threads that are running (not those asleep), so a frame's
share of the samples is its share of the process's busy Python time. The raw file has one line
per distinct stack, ``thread (tid): name;outermost (file:line);…;innermost (file:line) count``.

py-spy comes from the wheelhouse (scripts/wheelhouse.sh), installed with ``pip --target``, which
puts its binary in ``<target>/bin``: it is looked for there as well as on ``PATH``. When it is
missing or cannot attach (ptrace refused, …) the profile says so instead of failing the run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

RATE_HZ = 200
TOP_FRAMES = 15
_FRAME = re.compile(r"^(?P<function>.*) \((?P<where>[^()]*)\)$")


def py_spy_binary(paths: tuple[str, ...] | None = None) -> Path | None:
    """py-spy on PATH, next to this interpreter, or in ``bin/`` of a ``sys.path`` folder."""
    found = shutil.which("py-spy")
    if found:
        return Path(found)
    here = [Path(sys.executable).parent] + [Path(p or ".") / "bin" for p in (paths or tuple(sys.path))]
    return next((d / "py-spy" for d in here if os.access(d / "py-spy", os.X_OK)), None)


@dataclass
class Profile:
    samples: int
    own: Counter[str] = field(default_factory=Counter)  # innermost frame → samples
    threads: Counter[str] = field(default_factory=Counter)  # thread name → samples
    stacks: Counter[str] = field(default_factory=Counter)  # whole stack → samples


def summarise(raw: str) -> Profile:
    """Samples by innermost frame ("own" samples), by thread and by whole stack."""
    profile = Profile(0)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        profile.samples += n
        profile.own[frames[-1]] += n
        profile.threads[frames[0].partition(": ")[2] or frames[0]] += n
        profile.stacks[stack] += n
    return profile


def split_frame(frame: str) -> tuple[str, str]:
    """``"run (onnxruntime/…/session.py:287)"`` → ``("run", "onnxruntime/…/session.py:287")``."""
    match = _FRAME.match(frame)
    return (match["function"], match["where"]) if match else (frame, "")


def top_frames(profile: Profile, n: int = TOP_FRAMES) -> list[str]:
    """The ``n`` frames with the most own samples: share, function, file:line."""
    lines = []
    for frame, count in profile.own.most_common(n):
        function, where = split_frame(frame)
        lines.append(f"{100 * count / profile.samples:.1f}% {function} ({where or 'no file'})")
    return lines


def note(what: str, profile: Profile) -> str:
    """A note for results.md: the top frames as a nested list, and the busiest threads."""
    threads = ", ".join(
        f"{name} {100 * count / profile.samples:.0f}%" for name, count in profile.threads.most_common(6)
    )
    head = f"py-spy, {what}: {profile.samples:,} samples at {RATE_HZ} Hz; by thread: {threads}; "
    head += "top frames by own samples:"
    return "\n".join([head, *(f"  - {line}" for line in top_frames(profile))])


def top_stacks(profile: Profile, max_chars: int, frames: int = 10) -> str:
    """The heaviest stacks, innermost ``frames`` frames of each, within ``max_chars``."""
    out: list[str] = []
    size = 0
    for stack, count in profile.stacks.most_common():
        parts = stack.split(";")
        shown = " ← ".join(reversed(parts[-frames:])) + (" ← …" if len(parts) > frames else "")
        line = f"{100 * count / profile.samples:.1f}% [{parts[0]}] {shown}\n"
        if size + len(line) > max_chars:
            break
        out.append(line)
        size += len(line)
    return "".join(out)


class PySpy:
    """``with PySpy(pid, seconds, raw) as spy:`` records ``pid`` for ``seconds`` while the block
    runs, and waits for the recording at its end; then ``spy.profile``, or ``spy.why_not``."""

    def __init__(self, pid: int, seconds: float, raw: Path) -> None:
        self.pid, self.seconds, self.raw = pid, max(1, math.ceil(seconds)), raw
        self.profile: Profile | None = None
        self.why_not: str | None = None
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> PySpy:
        binary = py_spy_binary()
        if binary is None:
            self.why_not = "py-spy missing (not on PATH nor in bin/ of a sys.path folder)"
            return self
        self.raw.parent.mkdir(parents=True, exist_ok=True)
        self.raw.unlink(missing_ok=True)
        command = [str(binary), "record", "--format", "raw", "--rate", str(RATE_HZ), "--threads"]
        command += ["--nonblocking", "--duration", str(self.seconds), "--pid", str(self.pid)]
        try:
            self._process = subprocess.Popen(
                [*command, "-o", str(self.raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as e:
            self.why_not = f"py-spy failed to start: {e}"
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is None:
            return
        try:
            _, stderr = self._process.communicate(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, stderr = self._process.communicate()
        text = self.raw.read_text(errors="replace") if self.raw.is_file() else ""
        profile = summarise(text)
        if profile.samples:
            self.profile = profile
            return
        said = " ".join(line for line in stderr.strip().splitlines()[-3:] if line.strip())
        self.why_not = f"py-spy failed (exit {self._process.returncode}): {said[:300] or 'no samples'}"
