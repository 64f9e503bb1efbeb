"""The systems the GPU check's speed stage times (benchmarks/gpu/speed.py), on the tiny models: what
they compute must be the engine's answers, whichever way the sentences are fed."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu.ours import BEAM, EmbedOnDevice, OursOnDevice
from benchmarks.translators import TextCodec, Workload
from service.artefacts import read_manifest
from service.engine.base import TranslateItem, TranslateOptions
from tests.service.engine.test_embedder import TEXTS as EMBED_TEXTS
from tests.service.engine.translation.test_translator import TEXTS, ok


def codec_of(directory: Path) -> TextCodec:
    manifest = read_manifest(directory)
    eos, pad = manifest.special_ids.eos, manifest.special_ids.pad
    assert eos is not None and pad is not None
    return TextCodec(directory / manifest.tokenizer, eos_id=eos, pad_id=pad)


def test_whole_batches_and_continuous_decoding_give_the_engines_translations(
    provider: str, translation_fp16: Path
) -> None:
    ours = OursOnDevice(translation_fp16, provider, "ours")
    codec = codec_of(translation_fp16)
    texts = TEXTS * 3
    options = TranslateOptions(beam_size=BEAM, max_length=12)
    want = [
        ok(r).hypotheses[0].text for r in ours.engine.translate([TranslateItem(t, options) for t in texts])
    ]
    outputs, tokens = ours.translate(texts, Workload(BEAM, len(texts), 12, False))
    assert outputs == want and tokens > len(texts)
    rate, continuous = ours.continuous(texts, batch=4, codec=codec)  # at most 4 sentences at once
    assert continuous == want and rate > 0
    assert ours.engine.max_decode_rows == 4 * BEAM


def test_the_embedding_system_embeds_every_sentence(provider: str, embedding_fp16: Path) -> None:
    system = EmbedOnDevice(embedding_fp16, provider, batch=2, name="ours")
    system.embed(EMBED_TEXTS)  # raises the first failing item's error
    assert system.config == "batch 2" and system.engine.provider.lower().startswith(provider)
