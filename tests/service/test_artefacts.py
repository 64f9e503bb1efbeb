"""service/artefacts.py: the hashes that tie a manifest to its files and its source; the manifest's
optional fields."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from service.artefacts import (
    MANIFEST_NAME,
    Manifest,
    read_manifest,
    sha256_of,
    sha256_of_files,
    write_manifest,
)


def test_sha256_of_files_is_the_sorted_concatenation(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"second")
    (tmp_path / "a").write_bytes(b"first")
    assert sha256_of_files([tmp_path / "b", tmp_path / "a"]) == hashlib.sha256(b"firstsecond").hexdigest()
    first = hashlib.sha256(b"first").hexdigest()
    assert sha256_of_files([tmp_path / "a"]) == sha256_of(tmp_path / "a") == first


def _manifest_json(**fields: object) -> dict[str, object]:
    return {
        "name": "m",
        "task": "embed",
        "variant": "fp32",
        "source": {"kind": "bert", "path": "src", "sha256": "0" * 64},
        "files": [],
        "graphs": {},
        "vocab_size": 1,
        "special_ids": {"pad": 0},
        "opset": 17,
        "ir_version": 8,
        "onnxruntime_version": "test",
        "created_at": "2026-01-01T00:00:00+00:00",
        **fields,
    }


def test_trained_on_is_optional_so_manifests_from_before_it_still_load(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(_manifest_json()), encoding="utf-8")
    assert read_manifest(tmp_path).trained_on is None
    said = "Multi30k: image captions"
    write_manifest(tmp_path, Manifest.model_validate(_manifest_json(trained_on=said)))
    assert read_manifest(tmp_path).trained_on == said
