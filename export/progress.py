"""The export's progress lines, shared by every stage.

They go to stderr, where the command's errors go too, so that a log of both stays in order.
"""

from __future__ import annotations

import sys


def progress(message: str) -> None:
    print(f"[export] {message}", file=sys.stderr, flush=True)
