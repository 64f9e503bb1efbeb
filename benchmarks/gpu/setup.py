"""Get a GPU host without network ready for the GPU check: install from the wheelhouse what the
host lacks, and let every process the check starts find the CUDA libraries.

The wheelhouse (``make wheelhouse PY=3.12``: scripts/wheelhouse.sh) holds onnxruntime-gpu, the
service's dependencies and what the check needs. A GPU host already has torch, the ``nvidia-*``
CUDA wheels and many of the service's dependencies; installing ours over them would only risk
breaking torch, so a wheel is installed (with ``pip --target`` into a folder of its own, put first
on ``PYTHONPATH``) only when the host lacks its project, or has a version that a requirement of
the service or the check rejects. onnxruntime-gpu is a project of its own name: its ``onnxruntime``
module shadows the host's CPU build from that folder.

onnxruntime's ``preload_dlls`` (service/engine/session.py calls it) looks for the nvidia wheels
next to onnxruntime itself and then on the loader's path; installed apart from them, it finds them
only through ``LD_LIBRARY_PATH``, which the loader reads when a process starts. The check therefore
runs itself again in the environment ``check_environment`` returns, as it runs everything else.

Standard library only (``packaging`` where the host has it): this runs before anything is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENT_FILES = ("service.txt", "check.txt")  # written by scripts/wheelhouse.sh build
STAMP = ".wheels"  # in the target folder: the wheels installed there
# name-version(-build)?-python-abi-platform.whl; names and versions never contain "-"
_WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-(?P<python>[^-]+)-(?P<abi>[^-]+)-[^-]+\.whl$"
)


class SetupError(RuntimeError):
    """The wheelhouse cannot make this host ready; the message says why."""


def canonical(name: str) -> str:
    """A project name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: str
    python: str  # the wheel's Python tags, e.g. "cp312" or "py3"
    abi: str  # e.g. "cp312", "abi3", "none"

    @classmethod
    def from_path(cls, path: Path) -> Wheel:
        match = _WHEEL.match(path.name)
        if match is None:
            raise SetupError(f"{path}: not a wheel file name")
        return cls(path, canonical(match["name"]), match["version"], match["python"], match["abi"])

    def runs_on(self, version: tuple[int, int]) -> bool:
        """Whether CPython ``version`` can install it (an abi3 wheel names the oldest it runs on)."""
        major, minor = version
        for tag in self.python.split("."):
            if tag in ("py3", f"py{major}{minor}", f"cp{major}{minor}"):
                return True
            oldest = tag.removeprefix(f"cp{major}")
            if self.abi == "abi3" and oldest != tag and oldest.isdigit() and int(oldest) <= minor:
                return True
        return False


def wheels_in(directory: Path) -> list[Wheel]:
    return [Wheel.from_path(p) for p in sorted(directory.glob("*.whl"))]


def requirement_name(requirement: str) -> str:
    """``"uvicorn[standard]>=0.54"`` → ``"uvicorn"`` (canonical)."""
    return canonical(re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0])


def requirements_in(directory: Path) -> dict[str, str]:
    """Project → its requirement line, from the wheelhouse's requirement files."""
    out: dict[str, str] = {}
    for file in REQUIREMENT_FILES:
        path = directory / file
        if not path.is_file():
            raise SetupError(f"{path} missing: not a wheelhouse of scripts/wheelhouse.sh build")
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                out[requirement_name(line)] = line
    return out


def project_file() -> Path:
    """The project whose dependencies a wheelhouse holds: ``$PYPROJECT`` (as for
    scripts/wheelhouse.sh), else this repository's ``pyproject.toml``."""
    return Path(os.environ.get("PYPROJECT") or REPO / "pyproject.toml")


def service_requirements(pyproject: Path | None = None) -> list[str]:
    """The service's dependencies, onnxruntime replaced by the ``[gpu]`` extra's pin without that
    pin's own extras (they are the nvidia-* libraries, which a GPU host has): the wheelhouse's
    ``service.txt``."""
    import tomllib

    project = tomllib.loads((pyproject or project_file()).read_text())["project"]
    gpu = [re.sub(r"\[[^]]*\]", "", r) for r in project["optional-dependencies"]["gpu"]]
    return [r for r in project["dependencies"] if requirement_name(r) != "onnxruntime"] + gpu


def behind(wheelhouse: Path, pyproject: Path | None = None) -> list[str]:
    """The service's requirements that ``wheelhouse`` was not built for: it predates a change of
    ``pyproject.toml``, and a host installed from it would fail at the service's first import."""
    written = {line.strip() for line in (wheelhouse / REQUIREMENT_FILES[0]).read_text().splitlines()}
    return [r for r in service_requirements(pyproject) if r.strip() not in written]


def host_version(name: str) -> str | None:
    """The version of project ``name`` this interpreter has, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def accepts(requirement: str, version: str) -> bool:
    """Whether ``requirement``'s version specifier takes ``version`` (True without ``packaging``)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return True
    return Requirement(requirement).specifier.contains(version, prereleases=True)


def to_install(
    wheels: Iterable[Wheel],
    requirements: Mapping[str, str],
    installed: Callable[[str], str | None] = host_version,
) -> list[Wheel]:
    """The wheels of the projects the host lacks or has in a version a requirement rejects."""
    chosen = []
    for wheel in wheels:
        have = installed(wheel.name)
        wanted = requirements.get(wheel.name)
        if have is None or (wanted is not None and not accepts(wanted, have)):
            chosen.append(wheel)
    return chosen


def unmet(
    wheels: Iterable[Wheel],
    requirements: Mapping[str, str],
    installed: Callable[[str], str | None] = host_version,
) -> list[str]:
    """The requirements that neither the host nor a wheel here meets (a wheelhouse carried without
    the wheels of projects the host was expected to have, ``wheelhouse.sh split … LEAVE_OUT``)."""
    here = {w.name for w in wheels}
    missing = []
    for name, requirement in requirements.items():
        have = installed(name)
        if name not in here and (have is None or not accepts(requirement, have)):
            missing.append(f"{requirement} (the host has {have or 'none'})")
    return missing


def install(wheels: Sequence[Wheel], target: Path, python: str = sys.executable) -> bool:
    """``pip install --no-index --no-deps --target`` (the wheelhouse holds every dependency, the
    host the rest); → False when ``target`` already holds exactly these wheels."""
    names = "".join(sorted(f"{w.path.name}\n" for w in wheels))
    stamp = target / STAMP
    if stamp.is_file() and stamp.read_text() == names:
        return False
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if wheels:
        command = [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*command, "--target", str(target), *(str(w.path) for w in wheels)], check=True)
    stamp.write_text(names)
    return True


def nvidia_library_dirs(paths: Iterable[str] = tuple(sys.path)) -> list[Path]:
    """The ``lib`` folders of the ``nvidia-*`` wheels on ``paths`` (``nvidia/cu13/lib``,
    ``nvidia/cudnn/lib``, …), in path order."""
    found: list[Path] = []
    for entry in paths:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            found += [lib for lib in sorted(root.glob("*/lib")) if any(lib.glob("*.so*"))]
    return list(dict.fromkeys(found))


def check_environment(
    target: Path | None, environ: Mapping[str, str], libraries: Sequence[Path]
) -> dict[str, str]:
    """``environ`` with ``target`` first on PYTHONPATH and ``libraries`` first on LD_LIBRARY_PATH."""
    env = dict(environ)

    def prepend(name: str, first: Sequence[str]) -> None:
        rest = [p for p in env.get(name, "").split(os.pathsep) if p and p not in first]
        if first:
            env[name] = os.pathsep.join([*first, *rest])

    prepend("PYTHONPATH", [str(target.resolve())] if target is not None else [])
    prepend("LD_LIBRARY_PATH", [str(p) for p in libraries])
    return env


def default_wheelhouse(version: tuple[int, int] = sys.version_info[:2]) -> Path:
    """``.wheelhouse/py3.12`` for CPython 3.12: ``make wheelhouse PY=3.12``'s folder."""
    return REPO / ".wheelhouse" / f"py{version[0]}.{version[1]}"


def reassemble(wheelhouse: Path) -> None:
    """The wheelhouse from its parts (``<wheelhouse>-parts``, carried over one by one) when only
    they are here: checked and unpacked by scripts/wheelhouse.sh join."""
    parts = wheelhouse.with_name(wheelhouse.name + "-parts")
    if (wheelhouse / REQUIREMENT_FILES[0]).is_file() or not (parts / "SHA256SUMS").is_file():
        return
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "wheelhouse.sh"), "join", str(parts), str(wheelhouse)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SetupError(f"{parts}: the parts do not make the wheelhouse: {done.stderr.strip()}")
    print(done.stdout.strip(), flush=True)


def prepare(wheelhouse: Path | None, target: Path) -> tuple[dict[str, str], list[str]]:
    """Install what the host lacks from ``wheelhouse`` (None: install nothing) into ``target``;
    → the environment to run the check in, and lines saying what was done."""
    lines: list[str] = []
    installed_into: Path | None = None
    if wheelhouse is not None:
        reassemble(wheelhouse)
        wheels = wheels_in(wheelhouse)
        if not wheels:
            raise SetupError(f"no wheels in {wheelhouse}")
        foreign = [w.path.name for w in wheels if not w.runs_on(sys.version_info[:2])]
        if foreign:
            raise SetupError(
                f"{wheelhouse} is not for this Python {sys.version.split()[0]}: {', '.join(foreign[:3])}"
            )
        requirements = requirements_in(wheelhouse)
        if stale := behind(wheelhouse):
            raise SetupError(
                f"{wheelhouse} was built before pyproject.toml asked for {', '.join(stale)}: "
                f"rebuild it (make wheelhouse PY={sys.version_info[0]}.{sys.version_info[1]})"
            )
        if missing := unmet(wheels, requirements):
            raise SetupError(f"{wheelhouse} has no wheel for what this host lacks: {', '.join(missing)}")
        chosen = to_install(wheels, requirements)
        fresh = install(chosen, target)
        installed_into = target
        names = ", ".join(f"{w.name} {w.version}" for w in chosen) or "nothing"
        lines.append(f"{'installed' if fresh else 'already in'} {target}: {names}")
        lines.append(
            f"the host's own: {len(wheels) - len(chosen)} of the wheelhouse's {len(wheels)} projects"
        )
    libraries = nvidia_library_dirs()
    lines.append(f"CUDA libraries of nvidia-* wheels: {', '.join(map(str, libraries)) or 'none found'}")
    return check_environment(installed_into, os.environ, libraries), lines


if __name__ == "__main__":  # scripts/wheelhouse.sh: the requirements it downloads, and its freshness
    if sys.argv[1:] == ["service-requirements"]:
        print("\n".join(service_requirements()))
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "behind":
        sys.exit("\n".join(behind(*map(Path, sys.argv[2:]))) or None)
    else:
        sys.exit("usage: python -m benchmarks.gpu.setup service-requirements | behind WHEELHOUSE [PYPROJECT]")
