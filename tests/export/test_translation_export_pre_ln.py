"""A pre-LN checkpoint of ours (``norm_first``) through the export and the served engine: both
decoder layouts (slots for fp32/int8, positions for fp16) give PyTorch's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import encode_source
from export.sources.ours.translate import translate_ids as torch_translate_ids
from export.translation import export_translation, load_source
from export.verify.translation_checks import BUILTIN_SENTENCES, open_engine, translate_ids
from service.artefacts import read_manifest
from tests.tiny_models import few_reference_sentences, tiny_translation_checkpoint

TEXTS = ["a man rides a bike.", "two dogs run on the street.", "the big red cat sits.", "dogs"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ckpt") / "pre-ln-en-de"
    return tiny_translation_checkpoint(
        directory, max_len=48, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, norm_first=True
    )


def test_a_pre_ln_model_exports_and_serves_pytorchs_tokens(checkpoint: Path, tmp_path: Path) -> None:
    model = load_checkpoint(checkpoint / "model.safetensors")
    assert model.cfg.norm_first
    out = tmp_path / "artefacts"
    reference = few_reference_sentences(tmp_path / "reference.txt")  # what is checked here: parity
    dirs = export_translation(checkpoint, out, ["fp32", "fp16"], reference=reference)  # each vs PyTorch
    infos = {d.name: read_manifest(d).translation for d in dirs}
    layouts = {name: info.decoder_layout for name, info in infos.items() if info is not None}
    assert layouts == {"fp32": "per_layer_kv_slots", "fp16": "per_layer_kv_positions"}
    source = load_source(checkpoint)
    texts = TEXTS + BUILTIN_SENTENCES[:4]
    src_ids = encode_source(source.tokenizer, texts, model.cfg.max_len)
    engine = open_engine(out / "pre-ln-en-de" / "fp32", threads=1)
    for beam in (1, 3):
        assert translate_ids(engine, source, texts, beam_size=beam, batch_size=3) == torch_translate_ids(
            model, src_ids, beam_size=beam
        )
