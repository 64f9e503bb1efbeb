"""Print the GPU image's requirements: the project's base dependencies with ``onnxruntime``
swapped for the ``[gpu]`` extra (``onnxruntime-gpu``).

``pip install .[gpu]`` would install both wheels; they ship the same ``onnxruntime`` Python
package, so whichever is installed last silently overwrites the other (and uninstalling one
afterwards deletes files of both). The GPU image therefore installs these requirements and then
the project itself with ``--no-deps``: the CPU wheel is never installed. Torch is never listed.

Usage:
  python docker/gpu_requirements.py [pyproject.toml] > requirements-gpu.txt
  python docker/gpu_requirements.py --check-installed   # in the built env: exit 1 on a wrong set,
                                                        # or on a CUDA library the loader cannot find
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"unparseable requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def gpu_requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    gpu = list(project["optional-dependencies"]["gpu"])
    if not any(_name(r) == "onnxruntime-gpu" for r in gpu):
        raise SystemExit(f"{pyproject}: the [gpu] extra does not list onnxruntime-gpu")
    base = [r for r in project["dependencies"] if _name(r) != "onnxruntime"]
    return base + gpu


def check_installed() -> list[str]:
    """What is wrong with the running interpreter's environment as the GPU runtime (empty: ok)."""
    import importlib.metadata as metadata

    names = {_name(d.metadata["Name"]) for d in metadata.distributions()}
    problems = []
    if "onnxruntime" in names:
        problems.append("the CPU onnxruntime wheel is installed next to onnxruntime-gpu")
    if "onnxruntime-gpu" not in names:
        problems.append("onnxruntime-gpu is not installed")
    if "torch" in names:
        problems.append("torch is installed (the runtime is onnxruntime only)")
    if not problems:
        import onnxruntime  # compiled-in providers: no GPU needed to list CUDA

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            problems.append(f"no CUDAExecutionProvider in {onnxruntime.get_available_providers()}")
        else:
            problems += unresolved_cuda_libraries(Path(onnxruntime.__file__).parent)
    return problems


# The driver's own library: the NVIDIA container toolkit mounts it into the container at run
# time, so it is the one library a GPU image must not carry.
DRIVER_LIBRARIES = {"libcuda.so.1"}


def unresolved_cuda_libraries(package: Path) -> list[str]:
    """What the dynamic loader cannot find, with this process's environment (LD_LIBRARY_PATH), for
    the CUDA provider and for the CUDA/cuDNN libraries it loads at run time (cuDNN's are opened
    with dlopen, so the provider's own dependencies alone would not show them): a compiled-in
    provider whose libraries are missing fails only on the first session, on a GPU."""
    from onnxruntime.capi import build_and_package_info

    cuda_major = str(getattr(build_and_package_info, "cuda_version", "")).split(".")[0]
    site_packages = package.parent
    libraries = [package / "capi" / "libonnxruntime_providers_cuda.so"]
    for folder in (f"nvidia/cu{cuda_major}/lib", "nvidia/cudnn/lib"):
        found = sorted((site_packages / folder).glob("lib*.so*"))
        if not found:
            return [f"no libraries in {site_packages / folder} (onnxruntime-gpu[cuda,cudnn] installs them)"]
        libraries += found
    problems = []
    for library in libraries:
        ldd = subprocess.run(["ldd", str(library)], capture_output=True, text=True, check=False)
        for line in ldd.stdout.splitlines():
            name, _, where = line.strip().partition(" => ")
            if where.startswith("not found") and name not in DRIVER_LIBRARIES:
                problems.append(f"{library.name} needs {name}, which the loader cannot find")
    return problems


def main() -> None:
    args = sys.argv[1:]
    if args == ["--check-installed"]:
        problems = check_installed()
        for problem in problems:
            print(f"gpu env: {problem}", file=sys.stderr)
        raise SystemExit(1 if problems else 0)
    pyproject = Path(args[0]) if args else Path("pyproject.toml")
    print("\n".join(gpu_requirements(pyproject)))


if __name__ == "__main__":
    main()
