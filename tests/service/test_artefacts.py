"""service/artefacts.py: the hashes that tie a manifest to its files and its source."""

from __future__ import annotations

import hashlib
from pathlib import Path

from service.artefacts import sha256_of, sha256_of_files


def test_sha256_of_files_is_the_sorted_concatenation(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"second")
    (tmp_path / "a").write_bytes(b"first")
    assert sha256_of_files([tmp_path / "b", tmp_path / "a"]) == hashlib.sha256(b"firstsecond").hexdigest()
    first = hashlib.sha256(b"first").hexdigest()
    assert sha256_of_files([tmp_path / "a"]) == sha256_of(tmp_path / "a") == first
