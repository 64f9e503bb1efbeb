"""docker/: hadolint on both Dockerfiles, their structure (multi-stage, non-root, healthcheck,
settings), the runtime images' dependency sets as pip resolves them (no torch; on GPU no CPU
onnxruntime either), the compose files and the build context."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import DOCKER, REPO, require_tool, run, yaml

from service.settings import Settings

DOCKERFILES = {"cpu": DOCKER / "Dockerfile", "gpu": DOCKER / "Dockerfile.gpu"}


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for token in shlex.split(args):
                key, _, value = token.partition("=")
                out[key] = value
        return out


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages): continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            base = words[0]
            for name, value in args.items():
                base = base.replace("${" + name + "}", value)
            stages.append(Stage(name=words[2] if len(words) > 2 else str(len(stages)), base=base))
        elif not stages:
            if keyword == "ARG":
                name, _, value = rest.partition("=")
                args[name.strip()] = value.strip()
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


def _settings_fields() -> set[str]:
    return {f"TSERVE_{name.upper()}" for name in Settings.model_fields}


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_hadolint(flavour: str) -> None:
    hadolint = require_tool("hadolint")
    result = run([hadolint, "--no-color", str(DOCKERFILES[flavour])])
    assert result.returncode == 0, f"hadolint {DOCKERFILES[flavour].name}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("flavour", list(DOCKERFILES))
def test_dockerfile_structure(flavour: str) -> None:
    args, stages = parse_dockerfile(DOCKERFILES[flavour])
    names = [s.name for s in stages]
    assert "export" in names
    runtime = stages[-1]
    assert runtime.name == "runtime"
    export = stages[names.index("export")]
    assert export.base.startswith("python:3.11-slim")
    export_runs = " ".join(export.all("RUN"))
    assert "python -m export default --out /artefacts" in export_runs
    # torch as the [export] extra pins it, from the index or wheel folder the build is given
    assert _export_torch_pin() in export_runs
    assert {a.split("=")[0] for a in export.all("ARG")} >= {"TORCH_INDEX_URL", "TORCH_WHEELS"}
    assert '${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}' in export_runs
    assert '${TORCH_WHEELS:+--find-links "$TORCH_WHEELS"}' in export_runs
    # The runtime stage installs nothing itself: it copies the deps stage's venv + the artefacts.
    copies = runtime.all("COPY")
    assert any(c.startswith("--from=deps /opt/venv") for c in copies)
    assert any(c.startswith("--from=export /artefacts") for c in copies)
    assert not any("pip install" in r for r in runtime.all("RUN"))
    deps = stages[names.index("deps")]
    deps_runs = " ".join(deps.all("RUN"))
    assert "[export]" not in deps_runs and "torch==" not in deps_runs and "pytorch.org" not in deps_runs
    user = runtime.all("USER")[-1]
    assert user.split(":")[0] not in ("root", "0")
    # buildah does not create a WORKDIR, and a read-only root cannot: the image must have it
    assert runtime.all("WORKDIR") == ["/app"]
    runs = runtime.all("RUN")
    assert any(re.search(r"\bmkdir (-p )?(\S+ )*/app\b", r) for r in runs)
    # the glossaries' volume mount point, the service user's, so a new named volume is too (compose)
    assert any("chown tserve:tserve /var/lib/tserve/glossaries" in r for r in runs)
    assert runtime.all("EXPOSE") == ["8000"]
    assert runtime.all("STOPSIGNAL") == ["SIGTERM"]
    assert json.loads(runtime.all("CMD")[-1]) == ["python", "-m", "service"]
    healthcheck = runtime.all("HEALTHCHECK")[-1]
    assert "/health/ready" in healthcheck and "urllib" in healthcheck
    env = runtime.env()
    assert env["TSERVE_AUTO_EXPORT"] == "false"
    assert env["TSERVE_ARTEFACT_ROOT"] == "/artefacts"
    assert env["TSERVE_PORT"] == "8000"
    assert "TSERVE_INTRA_OP_THREADS" in env
    unknown = {k for k in env if k.startswith("TSERVE_")} - _settings_fields()
    assert not unknown, f"ENV not in service/settings.py: {sorted(unknown)}"
    Settings(**{k[len("TSERVE_") :].lower(): v for k, v in env.items() if k.startswith("TSERVE_")})
    if flavour == "cpu":
        assert "--variant int8 --variant fp32" in export_runs
        assert runtime.base.startswith("python:3.11-slim")
        assert env["TSERVE_PROVIDER"] == "cpu"
    else:
        assert "--variant fp16" in export_runs
        # CUDA comes from the nvidia-* wheels onnxruntime-gpu pins, never from a base image that
        # could carry another CUDA major version
        assert runtime.base.startswith("python:3.11-slim")
        assert not any(stage.base.startswith("nvidia/") for stage in stages)
        assert env["TSERVE_PROVIDER"] == "cuda"
        assert env["TSERVE_VARIANT"] == "fp16"
        assert any("gpu_requirements.py --check-installed" in r for r in deps.all("RUN"))
        # the library path the deps stage's check proved is the one the runtime uses
        assert deps.env()["LD_LIBRARY_PATH"] == env["LD_LIBRARY_PATH"] == "${CUDA_LIBRARY_PATH}"
        library_path = [Path(p).parts[-3:] for p in args["CUDA_LIBRARY_PATH"].split(":")]
        assert library_path == [("nvidia", "cu13", "lib"), ("nvidia", "cudnn", "lib")]
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def _export_torch_pin() -> str:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["export"]
    (pin,) = [r for r in extra if r.startswith("torch==")]
    return pin


def test_gpu_extra_pins_onnxruntime_gpu_with_its_cuda_libraries() -> None:
    """The [gpu] extra (the GPU image's and `pip install .[gpu]`'s onnxruntime) brings the CUDA
    and cuDNN wheels of the CUDA major version it was built for, and is pinned."""
    (gpu,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert re.fullmatch(r"onnxruntime-gpu\[cuda,cudnn\]==\d+\.\d+\.\d+", gpu), gpu


def _resolve(tmp_path: Path, *pip_args: str) -> dict[str, str]:
    """What `pip install` would put in a fresh environment: {normalised name: version}."""
    report = tmp_path / "report.json"
    result = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            *pip_args,
        ],
        timeout=600,
    )
    if result.returncode != 0 and (
        "Network is unreachable" in result.stderr or "Failed to establish a new connection" in result.stderr
    ):
        pytest.skip(f"no package index reachable: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in installs}


def _project_copy(tmp_path: Path) -> Path:
    """The project's metadata (pyproject.toml + README) with empty packages: same dependencies as
    `pip install .`, without copying the checkpoint or writing egg-info into the work tree."""
    src = tmp_path / "src"
    for package in ("service", "export"):
        (src / package).mkdir(parents=True)
        (src / package / "__init__.py").touch()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).is_file():
            (src / name).write_bytes((REPO / name).read_bytes())
    return src


@pytest.fixture(scope="module")
def runtime_deps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """What pip resolves for each image's deps stage: "cpu", `pip install .` (docker/Dockerfile);
    "gpu", docker/gpu_requirements.py's requirements (docker/Dockerfile.gpu). Both at once: each
    is a minute of waiting on the package index."""
    tmp_path = tmp_path_factory.mktemp("runtime-deps")
    result = run([sys.executable, str(DOCKER / "gpu_requirements.py"), str(REPO / "pyproject.toml")])
    assert result.returncode == 0, result.stderr
    (tmp_path / "gpu").mkdir()
    requirements = tmp_path / "gpu" / "requirements-gpu.txt"
    requirements.write_text(result.stdout)
    (tmp_path / "cpu").mkdir()
    with ThreadPoolExecutor(2) as pool:
        cpu = pool.submit(_resolve, tmp_path / "cpu", str(_project_copy(tmp_path / "cpu")))
        gpu = pool.submit(_resolve, tmp_path / "gpu", "--requirement", str(requirements))
        return {"cpu": cpu.result(), "gpu": gpu.result()}


def test_runtime_image_dependencies_have_no_torch(runtime_deps: dict[str, dict[str, str]]) -> None:
    """The CPU runtime image: onnxruntime world only."""
    resolved = runtime_deps["cpu"]
    assert "transformer-serving" in resolved
    assert "onnxruntime" in resolved
    heavy = sorted(
        n
        for n in resolved
        if n in {"torch", "torchvision", "triton", "transformers", "sentence-transformers", "onnxruntime-gpu"}
        or n.startswith("nvidia-")
    )
    assert not heavy, f"the CPU runtime image would install {heavy}"


def test_gpu_runtime_image_dependencies(runtime_deps: dict[str, dict[str, str]]) -> None:
    """docker/gpu_requirements.py (the deps stage of docker/Dockerfile.gpu): onnxruntime-gpu, and
    neither the CPU onnxruntime wheel (it would overwrite the GPU one) nor torch."""
    resolved = runtime_deps["gpu"]
    assert "onnxruntime-gpu" in resolved
    assert "onnxruntime" not in resolved
    assert not {"torch", "transformers"} & set(resolved)
    # and the project itself adds nothing on top: it is installed with --no-deps
    assert set(runtime_deps["cpu"]) - {"transformer-serving", "onnxruntime"} <= set(resolved)


def test_gpu_requirements_check_rejects_a_cpu_env() -> None:
    """--check-installed in this (CPU, torch) environment must fail, naming the problems."""
    result = run([sys.executable, str(DOCKER / "gpu_requirements.py"), "--check-installed"])
    assert result.returncode == 1
    assert "onnxruntime-gpu is not installed" in result.stderr


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").lstrip("/").removeprefix("**/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p.split("/")[-1], pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_builds_need() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (
        "pyproject.toml",
        "service/http/app.py",
        "service/metrics.py",
        "export/__init__.py",
        "docker/gpu_requirements.py",
    ):
        assert not _ignored(needed, patterns), needed
    for heavy in (".venv/bin/python", ".git/HEAD", ".artefacts/x/fp32/model.onnx", "shared/data/x"):
        assert _ignored(heavy, patterns), heavy


def _compose(*files: str) -> dict[str, Any]:
    compose = require_tool("docker-compose")
    args = [compose]
    for f in files:
        args += ["-f", str(DOCKER / f)]
    result = run([*args, "config"], timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_files_are_valid_and_complete() -> None:
    cpu = _compose("compose.yaml")
    assert set(cpu["services"]) == {"tserve", "prometheus", "grafana"}
    tserve = cpu["services"]["tserve"]
    assert tserve["build"]["dockerfile"] == "docker/Dockerfile"
    assert Path(tserve["build"]["context"]).resolve() == REPO
    for service in cpu["services"].values():
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), source
    gpu = _compose("compose.yaml", "compose.gpu.yaml")["services"]["tserve"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    assert gpu["environment"]["TSERVE_PROVIDER"] == "cuda"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_grafana_provisioning() -> None:
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (ds,) = datasource["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load((DOCKER / "prometheus/prometheus.yml").read_text())["global"]["scrape_interval"]
    assert ds["jsonData"]["timeInterval"] == scrape  # $__rate_interval derives from it
    providers = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/tserve.yml").read_text())[
        "providers"
    ]
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    mounts = dict(
        v.split(":")[1::-1] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./")
    )
    assert mounts[providers[0]["options"]["path"]] == "./grafana/dashboards"


def test_export_command_of_the_images_matches_the_cli() -> None:
    """The export stages run `python -m export default --out /artefacts --variant V [--variant V]`:
    the CLI must know those options (repeated --variant adds variants)."""
    result = run([sys.executable, "-m", "export", "default", "--help"], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for option in ("--out", "--variant"):
        assert option in result.stdout, f"`python -m export default --help` lists no {option}"
    for flavour, path in DOCKERFILES.items():
        _, stages = parse_dockerfile(path)
        runs = " ".join(stages[[s.name for s in stages].index("export")].all("RUN"))
        command = runs[runs.index("python -m export default") :].split("&&")[0].split()
        variants = [command[i + 1] for i, word in enumerate(command) if word == "--variant"]
        assert variants and set(variants) <= {"fp32", "int8", "fp16"}, flavour
