"""Bring training runs back from a GPU host in few, small files, and join them again here.

    python -m export.training.pack runs/en-de-a runs/en-de-b --out $OUT/en-de
    python -m export.training.pack --join $OUT/en-de --to runs/back

A device call returns a handful of files of at most 16 MiB each, so each run's model travels as
an fp16 safetensors checkpoint (half the bytes; the served variants are fp32, fp16 and int8
anyway) with its ``tokenizer.json``, ``history.json`` and ``generation_config.json`` if any.
Several runs share one tar stream, split into ``pack.part-NN`` files below the size limit, and
``pack.json`` lists the parts with their sha256 and the whole stream's. ``--join`` checks every
sha256, unpacks the runs and writes each model back as an fp32 checkpoint
(``<run>/model.safetensors``): the format the export and ``export.training.evaluate`` read.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from export.sources import GENERATION_CONFIG
from export.sources.ours.checkpoint import load_checkpoint, read_config, save_checkpoint

MANIFEST = "pack.json"
MODEL = "model.safetensors"
# Under the device tool's 16 MiB a file, with room to spare.
DEFAULT_PART_MIB = 15.0
COMPANIONS = ("tokenizer.json", "history.json", GENERATION_CONFIG)


def chosen_checkpoint(run: Path, name: str | None) -> Path:
    """``name`` in the run, else its averaged checkpoint, else its best."""
    candidates = [name] if name else ["averaged.safetensors", "best.safetensors"]
    for candidate in candidates:
        if (run / candidate).is_file():
            return run / candidate
    raise FileNotFoundError(f"{run}: none of {', '.join(candidates)}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def pack(
    runs: Sequence[Path], out: Path, checkpoint: str | None = None, part_mib: float = DEFAULT_PART_MIB
) -> Path:
    """Write ``out/pack.part-NN`` and ``out/pack.json`` holding ``runs``; returns the manifest's path."""
    names = [run.resolve().name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"runs must have distinct directory names: {names}")
    stream, described = io.BytesIO(), []
    with tarfile.open(fileobj=stream, mode="w") as tar, tempfile.TemporaryDirectory() as tmp:
        for run, name in zip(runs, names, strict=True):
            source = chosen_checkpoint(run, checkpoint)
            half = Path(tmp) / f"{name}.safetensors"
            save_checkpoint(load_checkpoint(source), half, dtype=torch.float16)
            add_bytes(tar, f"{name}/{MODEL}", half.read_bytes())
            present = [c for c in COMPANIONS if (run / c).is_file()]
            for companion in present:
                add_bytes(tar, f"{name}/{companion}", (run / companion).read_bytes())
            described.append(
                {"run": name, "checkpoint": source.name, "config": read_config(source).to_dict()}
            )
    whole = stream.getvalue()
    size = int(part_mib * 2**20)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, start in enumerate(range(0, len(whole), size), 1):
        part = whole[start : start + size]
        (out / f"pack.part-{index:02d}").write_bytes(part)
        parts.append({"file": f"pack.part-{index:02d}", "bytes": len(part), "sha256": sha256(part)})
    manifest = {"bytes": len(whole), "sha256": sha256(whole), "parts": parts, "runs": described}
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1))
    return path


def join(packed: Path, dest: Path) -> list[Path]:
    """Check and unpack ``packed`` (the folder of ``pack.json``) into ``dest/<run>/`` with fp32
    checkpoints; returns the run directories. Raises ValueError on a missing or altered part."""
    manifest: dict[str, Any] = json.loads((packed / MANIFEST).read_text())
    chunks = []
    for part in manifest["parts"]:
        data = (packed / part["file"]).read_bytes()
        if sha256(data) != part["sha256"]:
            raise ValueError(f"{packed / part['file']}: sha256 differs from {MANIFEST}'s")
        chunks.append(data)
    whole = b"".join(chunks)
    if sha256(whole) != manifest["sha256"]:
        raise ValueError(f"{packed}: the joined parts' sha256 differs from {MANIFEST}'s")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(whole), mode="r") as tar:
        tar.extractall(dest, filter="data")  # refuses absolute paths, links out and special files
    runs = []
    for run in manifest["runs"]:
        directory = dest / run["run"]
        model = directory / MODEL
        save_checkpoint(load_checkpoint(model), model)  # fp16 on disk → fp32, as the export expects
        runs.append(directory)
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m export.training.pack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", type=Path, nargs="*", help="training work directories to pack")
    p.add_argument("--out", type=Path, help="where pack.json and the parts go")
    p.add_argument("--checkpoint", help="file to take from each run (default: averaged, else best)")
    p.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB, help="largest part, MiB")
    p.add_argument("--join", type=Path, help="a folder holding pack.json and its parts: unpack it")
    p.add_argument("--to", type=Path, help="with --join: where the runs go")
    args = p.parse_args(argv)
    if args.join:
        if not args.to:
            p.error("--join needs --to")
        for run in join(args.join, args.to):
            print(run / MODEL)
    elif args.runs and args.out:
        manifest = json.loads(pack(args.runs, args.out, args.checkpoint, args.part_mib).read_text())
        print(
            json.dumps({"parts": len(manifest["parts"]), "bytes": manifest["bytes"], "runs": len(args.runs)})
        )
    else:
        p.error("give RUN... --out DIR, or --join DIR --to DIR")


if __name__ == "__main__":
    main()
