"""export/encoder_export.py: what an embedding or rerank export starts from (the graphs and the
manifests it publishes are checked end to end by test_embedding_export.py and test_rerank_export.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from export.encoder_export import EncoderExport
from export.verify.reference_set import REFERENCE_FILE, load_reference
from service.artefacts import sha256_of_files


def test_start_names_the_artefact_after_the_source_and_keeps_the_hub_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    source = tmp_path / "tiny-model"
    source.mkdir()
    weights = [source / "model.safetensors"]
    weights[0].write_bytes(b"weights")

    run = EncoderExport.start(source, tmp_path / "out", None, weights, REFERENCE_FILE)

    assert (run.name, run.root) == ("tiny-model", tmp_path / "out" / "tiny-model")
    assert run.sha == sha256_of_files(weights)
    assert run.reference_set == load_reference(REFERENCE_FILE)
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert EncoderExport.start(source, tmp_path, "named", weights, REFERENCE_FILE).root == tmp_path / "named"
