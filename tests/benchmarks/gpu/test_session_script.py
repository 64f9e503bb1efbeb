"""scripts/gpu-session.sh: the device calls' steps keep every carried part, and say their usage."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu-session.sh"


def session(step: str, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TSERVE_PARTS": str(tmp_path / "kept"), "TSERVE_RUNS": str(tmp_path / "runs")}
    return subprocess.run(
        ["bash", str(SCRIPT), step], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_each_part_call_keeps_its_part_beside_the_earlier_ones(tmp_path: Path) -> None:
    """A call carries one part; the next call's tree may lack it. Each call keeps what it got
    outside the tree and puts every part kept so far back into it, for the check's setup."""
    tree = tmp_path / "tree"
    carried = tree / ".wheelhouse" / "py3.12-parts"
    carried.mkdir(parents=True)
    (carried / "part-01").write_bytes(b"one")
    assert "parts here: 1" in session("part", tree, tmp_path).stdout
    (carried / "part-01").unlink()
    (carried / "part-02").write_bytes(b"two")
    assert "parts here: 2" in session("part", tree, tmp_path).stdout
    assert sorted(p.name for p in carried.iterdir()) == ["part-01", "part-02"]
    assert (carried / "part-01").read_bytes() == b"one"


def test_an_unknown_step_prints_the_usage(tmp_path: Path) -> None:
    done = session("upload", tmp_path, tmp_path)
    assert done.returncode == 2 and "bash scripts/gpu-session.sh speed" in done.stdout
