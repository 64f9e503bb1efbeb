"""scripts/gpu-train.sh: runs side by side, ranked on val, the best of each direction packed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from export.training.pack import join
from tests.export.training.test_train import write_corpus

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu-train.sh"
TINY = "--d-model 16 --heads 2 --d-ff 32 --layers 1 --vocab-size 60 --max-len 32 --max-tokens 128 --warmup 10"


def test_the_grid_ranks_its_runs_and_packs_the_best_of_each_direction(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_corpus(data, n_train=30, n_val=6)
    runs = tmp_path / "runs.txt"
    runs.write_text(
        "# name src tgt options\n"
        f"ende-a en de {TINY} --epochs 2\n"
        f"ende-b en de {TINY} --epochs 1\n"
        f"deen-a de en {TINY} --epochs 1\n"
    )
    work = tmp_path / "work"
    env = os.environ | {"PYTHON": sys.executable, "GRID_COMMON": "--device cpu --threads 1 --average-last 2"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "5", str(runs), str(data), str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=SCRIPT.parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (work / "DONE").is_file()
    ranking = json.loads((work / "ranking.json").read_text())
    assert sorted(r["run"] for r in ranking) == ["deen-a", "ende-a", "ende-b"]
    assert [r["score"] for r in ranking] == sorted((r["score"] for r in ranking), reverse=True)
    assert {r["run"]: r["epochs"] for r in ranking} == {"ende-a": 2, "ende-b": 1, "deen-a": 1}
    best_ende = next(r for r in ranking if r["run"].startswith("ende"))
    assert sorted(p.name for p in (work / "packs").iterdir()) == ["deen", "ende"]
    back = join(work / "packs" / "ende", tmp_path / "back")
    assert [p.name for p in back] == [best_ende["run"]]
    assert (tmp_path / "back" / best_ende["run"] / "model.safetensors").is_file()
