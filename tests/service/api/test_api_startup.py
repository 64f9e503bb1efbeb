"""Start-up: the export subprocess (failure, timeout, success) and loading errors."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from service.artefacts import ArtefactError
from service.serving.startup import run_export

pytestmark = pytest.mark.anyio


def fake_python(tmp_path: Path, body: str) -> str:
    """A stand-in for ``sys.executable``: a shell script that logs its arguments."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\necho "args: $*"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_export_runs_in_a_subprocess_with_the_out_dir_and_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", fake_python(tmp_path, 'touch "$5/exported"'))
    await run_export(tmp_path, "int8", timeout_s=30)
    assert (tmp_path / "exported").exists()


async def test_a_failed_export_quotes_its_output_and_hints_at_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", fake_python(tmp_path, "echo \"No module named 'torch'\"; exit 3"))
    with pytest.raises(ArtefactError) as failed:
        await run_export(tmp_path / "out", "fp16", timeout_s=30)
    message = str(failed.value)
    assert "exit code 3" in message and "torch missing" in message and "pip install '.[export]'" in message
    assert f"args: -m export default --out {tmp_path / 'out'} --variant fp16" in message


async def test_a_stuck_export_is_killed_at_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", fake_python(tmp_path, "exec sleep 30"))
    with pytest.raises(ArtefactError, match=r"did not finish within 0\.3 s"):
        await run_export(tmp_path, "fp32", timeout_s=0.3)


def test_the_service_process_never_imports_torch() -> None:
    import subprocess

    code = "\n".join(
        [
            "import sys, service.__main__, service.http.app",
            "try:",
            "    import service.engine.loader  # what the app imports to serve real models",
            "except ModuleNotFoundError as e:",  # a half-written engine is not this test's concern
            "    assert e.name.startswith('service.'), e",
            "sys.exit(1 if 'torch' in sys.modules else 0)",
        ]
    )
    root = Path(__file__).resolve().parents[3]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, timeout=120).returncode == 0
