"""Start-up: the export subprocess (failure, timeout, success) and loading errors."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from service.artefacts import MANIFEST_NAME, ArtefactError
from service.serving import startup
from service.serving.startup import load_engines, run_export
from service.settings import Settings

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


async def test_processes_starting_together_export_the_missing_models_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several serving processes (TSERVE_WORKERS) find the same artefacts missing: the first to
    take the artefact root's lock exports, the others wait and find them there."""
    exports: list[str] = []

    async def export(out: Path, variant: str, timeout_s: float) -> None:
        exports.append(variant)
        await asyncio.sleep(0.2)  # long enough for the others to be waiting
        (out / "all-MiniLM-L6-v2" / variant).mkdir(parents=True)
        (out / "all-MiniLM-L6-v2" / variant / MANIFEST_NAME).write_text("{}")

    monkeypatch.setattr(startup, "run_export", export)
    monkeypatch.setattr(startup, "is_stale", lambda directory: False)
    monkeypatch.setattr("service.engine.loader.load_engine", lambda directory, *a, **k: _Loaded())
    settings = Settings(artefact_root=tmp_path, translate_model="", variant="fp32", provider="cpu")
    await asyncio.gather(*(load_engines(settings) for _ in range(3)))
    assert exports == ["fp32"]


class _Loaded:
    manifest: Any = type("M", (), {"task": "embed"})()


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
