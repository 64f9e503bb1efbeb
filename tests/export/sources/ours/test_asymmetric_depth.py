"""A deep encoder with a shallow decoder (3 + 1 layers): the checkpoint keeps both depths, and the
ONNX export served by the service's engine gives the tokens PyTorch gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.sources.ours.checkpoint import load_checkpoint, read_config
from export.sources.ours.data import encode_source
from export.sources.ours.translate import translate_ids as torch_translate_ids
from export.translation import export_translation, load_source
from export.verify.translation_checks import open_engine, translate_ids
from service.artefacts import load_and_verify
from tests.tiny_models import few_reference_sentences, tiny_translation_checkpoint

TEXTS = ["a man rides a bike.", "two dogs run on the street.", "the big red cat sits.", "dogs"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ckpt") / "deep-en-de"
    return tiny_translation_checkpoint(directory, max_len=40, n_encoder_layers=3, n_decoder_layers=1)


def test_the_checkpoint_keeps_both_depths(checkpoint: Path) -> None:
    """3 encoder and 1 decoder layers in the embedded config and in the weights."""
    cfg = read_config(checkpoint / "model.safetensors")
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers) == (3, 1)
    model = load_checkpoint(checkpoint / "model.safetensors")
    assert (len(model.encoder), len(model.decoder)) == (3, 1)


def test_the_served_export_equals_pytorch(checkpoint: Path, tmp_path: Path) -> None:
    """The fp32 artefact records the decoder's depth (its cache has one layer) and the engine's
    greedy and beam tokens equal TorchDecoder's."""
    reference = few_reference_sentences(tmp_path / "reference.txt")
    (directory,) = export_translation(checkpoint, tmp_path / "artefacts", ["fp32"], reference=reference)
    manifest = load_and_verify(directory)
    assert manifest.translation is not None and manifest.translation.n_layers == 1
    model = load_checkpoint(checkpoint / "model.safetensors")
    source = load_source(checkpoint)
    src_ids = encode_source(source.tokenizer, TEXTS, model.cfg.max_len)
    engine = open_engine(directory, threads=1)
    for beam in (1, 3):
        assert translate_ids(engine, source, TEXTS, beam_size=beam, batch_size=3) == torch_translate_ids(
            model, src_ids, beam_size=beam
        )
