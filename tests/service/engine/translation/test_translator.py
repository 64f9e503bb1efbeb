"""OnnxTranslator on a tiny exported model: parity with the PyTorch reference, options, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export.graphs.translation_layout import POSITIONS_DECODER, DecoderIO
from service.artefacts import (
    BEAM_ROWS,
    MEMORY_ROWS,
    ArtefactError,
    read_manifest,
    served_decoder_layout,
    write_manifest,
)
from service.engine.base import (
    Abandoned,
    TextTooLong,
    TranslateItem,
    TranslateOptions,
    Translation,
    TranslationHypothesis,
)
from service.engine.session import SessionConfig
from service.engine.translation.decoding import DeviceBackend, HostBackend
from service.engine.translation.positions import PositionsDecoder
from service.engine.translation.running import RunningDecode
from service.engine.translation.translator import OnnxTranslator
from service.metrics import OUTPUT_TOKENS

TEXTS = [
    "a man rides a bike",
    "two dogs run",
    "a small cat sits on the big red street",
    "the cat",
    "red",
    "big dogs sit on a man",
]


@pytest.fixture(scope="module")
def translator(translation_artefact: Path) -> OnnxTranslator:
    engine = OnnxTranslator(translation_artefact, SessionConfig("cpu", 1))
    engine.warmup()
    return engine


def ok(result: Translation | Exception) -> Translation:
    assert isinstance(result, Translation), result
    return result


def ids_of(engine: OnnxTranslator, result: Translation | Exception, n: int = 0) -> list[int]:
    """Hypothesis n's ids, back from its piece strings."""
    vocab = engine.tokenizer._full.get_vocab()
    return [vocab[p] for p in ok(result).hypotheses[n].tokens]


def torch_ids(checkpoint: Path, texts: list[str], beam_size: int, max_len: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from export.sources.ours.checkpoint import load_checkpoint
    from export.sources.ours.data import encode_source
    from export.sources.ours.translate import translate_ids

    model = load_checkpoint(checkpoint / "model.safetensors")
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    return translate_ids(
        model, encode_source(tok, texts, model.cfg.max_len), beam_size=beam_size, max_len=max_len
    )


def items(texts: list[str], **options: object) -> list[TranslateItem]:
    return [TranslateItem(t, TranslateOptions(**options)) for t in texts]  # type: ignore[arg-type]


@pytest.mark.parametrize("beam", [1, 4])
def test_tokens_equal_the_pytorch_reference(
    translator: OnnxTranslator, translation_checkpoint: Path, beam: int
) -> None:
    """Greedy (and beam 4) output ids equal export.sources.ours.translate's TorchDecoder under the
    same search."""
    want = torch_ids(translation_checkpoint, TEXTS, beam, max_len=12)
    got = translator.translate(items(TEXTS, beam_size=beam, max_length=12))
    assert [ids_of(translator, r) for r in got] == want
    assert len({len(w) for w in want}) > 1, "the tiny model should stop at different lengths"
    if beam == 1:
        assert translator.provider == "CPUExecutionProvider"


def test_io_binding_backend_matches_the_host_backend(
    translation_checkpoint: Path, translation_artefact: Path, tmp_path: Path
) -> None:
    """The CUDA code path (IO binding, cache kept as OrtValues and reordered by the decoder graph,
    the memory bound layer by layer at its address), on CPU, with the layout the GPU variant
    (fp16) is exported with; the slot layout keeps host buffers."""
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    device = OnnxTranslator(positions, SessionConfig("cpu", 1), io_binding=True)
    translator = OnnxTranslator(positions, SessionConfig("cpu", 1))
    assert isinstance(device.backend, DeviceBackend) and isinstance(translator.backend, HostBackend)
    assert isinstance(
        OnnxTranslator(translation_artefact, SessionConfig("cpu", 1), io_binding=True).backend, HostBackend
    )
    batch = items(TEXTS, beam_size=3, n_best=2, max_length=10, alignments=True)
    for a, b in zip(device.translate(batch), translator.translate(batch), strict=True):
        assert [h.tokens for h in ok(a).hypotheses] == [h.tokens for h in ok(b).hypotheses]
        np.testing.assert_allclose(
            [h.score for h in ok(a).hypotheses], [h.score for h in ok(b).hypotheses], rtol=1e-5
        )
        align_a, align_b = ok(a).hypotheses[0].alignment, ok(b).hypotheses[0].alignment
        assert align_a is not None and align_b is not None
        np.testing.assert_allclose(align_a, align_b, atol=1e-6)


def test_n_best_hypotheses_are_sorted_and_distinct(translator: OnnxTranslator) -> None:
    for result in translator.translate(items(TEXTS, beam_size=4, n_best=3, max_length=10)):
        hyps = ok(result).hypotheses
        assert len(hyps) == 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3
        assert ok(result).n_output_tokens == len(hyps[0].tokens)


def test_mixed_options_in_one_batch_equal_each_item_alone(translator: OnnxTranslator) -> None:
    """Items are grouped by search options; neither the groups nor the padding change results."""
    batch = [
        TranslateItem(TEXTS[0], TranslateOptions(beam_size=1, max_length=8)),
        TranslateItem(TEXTS[2], TranslateOptions(beam_size=4, n_best=2, max_length=12, alignments=True)),
        TranslateItem(TEXTS[1], TranslateOptions(beam_size=1, max_length=3)),
        TranslateItem(TEXTS[3], TranslateOptions(beam_size=4, n_best=2, max_length=12, alignments=True)),
        TranslateItem(TEXTS[5], TranslateOptions(beam_size=2, length_penalty=0.6, max_length=12)),
    ]
    together = translator.translate(batch)
    for item, result in zip(batch, together, strict=True):
        (alone,) = translator.translate([item])
        assert [h.tokens for h in ok(result).hypotheses] == [h.tokens for h in ok(alone).hypotheses]
        for a, b in zip(ok(result).hypotheses, ok(alone).hypotheses, strict=True):
            assert a.score == pytest.approx(b.score, rel=1e-5)
            assert (a.alignment is None) == (b.alignment is None) == (not item.options.alignments)


def test_a_long_sentence_is_encoded_apart_from_short_ones(
    translator: OnnxTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitting sentences of very different lengths runs the encoder on runs that pad less
    (``tokenizer.padded_partition``), and nothing changes in the results."""
    widths: list[tuple[int, int]] = []
    encode = translator.backend.encode

    def spy(input_ids: np.ndarray) -> tuple[object, object]:
        widths.append(input_ids.shape)
        return encode(input_ids)

    batch = items(["red", "the cat", "two dogs run", "red", "the cat", " ".join([TEXTS[2]] * 2)], beam_size=2)
    monkeypatch.setattr(translator.backend, "encode", spy)
    together = translator.translate(batch)
    assert len(widths) == 2 and max(rows for rows, _ in widths) == 5  # the shorts, then the long one
    assert sum(rows * width for rows, width in widths) < len(batch) * max(width for _, width in widths)
    for item, result in zip(batch, together, strict=True):
        (alone,) = translator.translate([item])
        assert [h.tokens for h in ok(result).hypotheses] == [h.tokens for h in ok(alone).hypotheses]


def test_max_length_is_respected_per_item(translator: OnnxTranslator) -> None:
    """Each item stops at its own max_length, and gets what it would get with that limit alone."""
    long_run = translator.translate(items([TEXTS[2]], beam_size=1, max_length=20))
    assert ok(long_run[0]).n_output_tokens > 2
    results = translator.translate(
        [
            TranslateItem(TEXTS[2], TranslateOptions(beam_size=1, max_length=2)),
            TranslateItem(TEXTS[2], TranslateOptions(beam_size=1, max_length=20)),
        ]
    )
    assert ok(results[0]).hypotheses[0].tokens == ok(long_run[0]).hypotheses[0].tokens[:2]
    assert ok(results[1]).hypotheses[0].tokens == ok(long_run[0]).hypotheses[0].tokens
    for r in translator.translate(items(TEXTS, beam_size=3, n_best=3, max_length=3)):
        assert all(len(h.tokens) <= 3 for h in ok(r).hypotheses)


def test_alignments_are_target_by_source_attention(translator: OnnxTranslator) -> None:
    (result,) = translator.translate(items([TEXTS[0]], beam_size=2, n_best=2, alignments=True, max_length=8))
    r = ok(result)
    assert r.source_tokens[-1] == "</s>" and len(r.source_tokens) == r.n_input_tokens
    for h in r.hypotheses:
        assert h.alignment is not None
        assert np.shape(h.alignment) == (len(h.tokens), len(r.source_tokens))
        np.testing.assert_allclose(np.sum(h.alignment, axis=1), 1.0, atol=1e-4)  # softmax over real tokens
    (plain,) = translator.translate(items([TEXTS[0]], beam_size=2, max_length=8))
    assert ok(plain).hypotheses[0].alignment is None


def test_bad_items_fail_alone(translator: OnnxTranslator) -> None:
    """Too long, impossible options and empty text are per-item outcomes; the rest is translated."""
    too_long = " ".join(["red"] * 60)
    batch = [
        TranslateItem(TEXTS[0], TranslateOptions(beam_size=1, max_length=12)),
        TranslateItem(too_long),
        TranslateItem(TEXTS[1], TranslateOptions(beam_size=2, n_best=3)),
        TranslateItem("   "),
        TranslateItem(TEXTS[1], TranslateOptions(max_length=0)),
        TranslateItem(TEXTS[4], TranslateOptions(beam_size=1, max_length=12)),
        TranslateItem(TEXTS[1], TranslateOptions(beam_size=65)),  # wider than the search's rows hold
    ]
    got = translator.translate(batch)
    assert isinstance(got[1], TextTooLong)
    assert isinstance(got[2], ValueError) and "n_best" in str(got[2])
    assert isinstance(got[4], ValueError) and "max_length" in str(got[4])
    assert isinstance(got[6], ValueError) and "beam_size" in str(got[6])
    assert ok(got[3]).hypotheses[0].text == "" and ok(got[3]).n_input_tokens == 0
    assert ok(got[0]).hypotheses == ok(translator.translate([batch[0]])[0]).hypotheses
    assert ok(got[5]).hypotheses == ok(translator.translate([batch[5]])[0]).hypotheses
    assert translator.count_tokens(too_long) == 61


def test_detokenized_text_and_output_token_counter(translator: OnnxTranslator) -> None:
    counter = OUTPUT_TOKENS.labels(model=translator.name)
    before = counter._value.get()
    results = [ok(r) for r in translator.translate(items(TEXTS[:3], beam_size=1, max_length=12))]
    assert counter._value.get() - before == sum(r.n_output_tokens for r in results)
    for r in results:
        h = r.hypotheses[0]
        assert h.text == translator.tokenizer.decode_batch([ids_of(translator, r)])[0]
        assert "</s>" not in h.tokens and "<s>" not in h.text


@pytest.mark.parametrize("io_binding", [False, True])
def test_fp16_variant_keeps_a_float16_cache(
    translation_fp16: Path, translator: OnnxTranslator, io_binding: bool
) -> None:
    """The CUDA default variant: float16 memory/cache fed back as float16; tokens as fp32 here."""
    engine = OnnxTranslator(translation_fp16, SessionConfig("cpu", 1), io_binding=io_binding)
    assert engine.manifest.variant == "fp16" and engine.cache_dtype == np.float16
    batch = items(TEXTS, beam_size=2, max_length=10, alignments=True)
    for half, full in zip(engine.translate(batch), translator.translate(batch), strict=True):
        assert ok(half).hypotheses[0].tokens == ok(full).hypotheses[0].tokens


def test_an_abandoned_item_is_not_computed_and_the_others_are_unchanged(translator: OnnxTranslator) -> None:
    batch = items(TEXTS, beam_size=4)
    alone = [ids_of(translator, r) for r in translator.translate(batch)]
    batch = items(TEXTS, beam_size=4)
    batch[2].abandoned.set()  # its client left while it was queued with the others
    results = translator.translate(batch)
    assert isinstance(results[2], Abandoned)
    assert [ids_of(translator, r) for i, r in enumerate(results) if i != 2] == alone[:2] + alone[3:]


def test_an_item_abandoned_during_the_search_leaves_it_at_the_next_step(translator: OnnxTranslator) -> None:
    """The search asks before every decoder step; flagging an item mid-decode stops its rows."""
    batch = items(["a small cat sits on the big red street", "two dogs run"], beam_size=2, max_length=40)
    decode_step = RunningDecode.step

    def counting_step(self: RunningDecode) -> object:
        if len(rows) == 1:
            batch[0].abandoned.set()
        rows.append(self.rows)
        return decode_step(self)

    rows: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunningDecode, "step", counting_step)
        results = translator.translate(batch)
    assert isinstance(results[0], Abandoned) and isinstance(results[1], Translation)
    assert rows[0] == rows[1] == 4 and rows[2] == 2  # from the third step on, only the other's 2 beams


def test_the_device_backend_runs_only_the_decoder_once_a_step(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    """The positions layout on the device backend: besides encoding, a batch is one decoder run
    per decoder step, the beams' reorders and the memory's cut into layers included (no other
    onnxruntime session runs)."""
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    engine = OnnxTranslator(positions, SessionConfig("cpu", 1), io_binding=True)
    assert isinstance(engine.backend, DeviceBackend)
    runs: list[ort.InferenceSession] = []
    steps: list[int] = []
    real_run, real_step = ort.InferenceSession.run_with_iobinding, RunningDecode.step

    def counted_run(self: ort.InferenceSession, *args: object, **kwargs: object) -> object:
        runs.append(self)
        return real_run(self, *args, **kwargs)  # type: ignore[arg-type]

    def counted_step(self: RunningDecode) -> object:
        steps.append(self.rows)
        return real_step(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort.InferenceSession, "run_with_iobinding", counted_run)
        patch.setattr(ort.InferenceSession, "run", lambda *_, **__: pytest.fail("a run without binding"))
        patch.setattr(RunningDecode, "step", counted_step)
        results = engine.translate(items(TEXTS, beam_size=4, n_best=2, max_length=12))
    assert all(isinstance(r, Translation) for r in results) and len(steps) > 2
    encoder, decoder = engine.backend.encoder, engine.backend.decoder
    assert runs.count(decoder) == len(steps) and runs.count(encoder) + runs.count(decoder) == len(runs)


def test_a_positions_artefact_from_before_the_graph_reordered_its_cache_is_refused_and_stale(
    translation_checkpoint: Path, tmp_path: Path
) -> None:
    """A positions decoder without beam_rows / memory_rows (its cache reordered by runs of its
    own) is no longer served: loading says to export again, and the service's start counts it
    stale (``served_decoder_layout``), so ``make serve`` exports it again."""
    positions = artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER)
    assert served_decoder_layout(read_manifest(positions))
    manifest = json.loads((positions / "manifest.json").read_text())
    decoder = manifest["graphs"]["decoder"]
    decoder["inputs"] = [t for t in decoder["inputs"] if t["name"] not in (BEAM_ROWS, MEMORY_ROWS)]
    (positions / "manifest.json").write_text(json.dumps(manifest))
    assert not served_decoder_layout(read_manifest(positions))
    with pytest.raises(ArtefactError, match=r"without beam_rows.*export the model again"):
        OnnxTranslator(positions, SessionConfig("cpu", 1))


def artefact_with_layout(checkpoint: Path, out: Path, decoder: DecoderIO) -> Path:
    """An fp32 artefact of ``checkpoint`` whose decoder has the layout of ``decoder`` (the
    export's own graph building and manifest, without its verification)."""
    from export.graphs.translation import build_fp32
    from export.publish.translation import build_manifest
    from export.translation import load_source, write_tokenizer

    source = load_source(checkpoint)
    build_fp32(source, out, decoder)
    write_tokenizer(source, out)
    write_manifest(out, build_manifest(source, "fp32", out, "0" * 64, {}, {}))
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_the_positions_layout_translates_exactly_as_the_slot_layout(
    translator: OnnxTranslator, translation_checkpoint: Path, tmp_path: Path, beam: int
) -> None:
    """The fp16 variant's layout, traced in fp32, decoded by its own class: every hypothesis
    equals the default layout's (per-layer slot caches written in place), in a batch and alone:
    the same tokens, and scores and alignments to float rounding (the slot layout's attention is
    onnxruntime's GroupQueryAttention kernel, the positions layout's the traced MatMul/Softmax)."""
    assert translator.info.decoder_layout == "per_layer_kv_slots"
    other = OnnxTranslator(
        artefact_with_layout(translation_checkpoint, tmp_path / "positions", POSITIONS_DECODER),
        SessionConfig("cpu", 1),
    )
    assert other.info.decoder_layout == POSITIONS_DECODER.layout
    assert other.decoder_class is PositionsDecoder and other.joins_midway
    options = TranslateOptions(beam_size=beam, n_best=beam, alignments=True)
    items = [TranslateItem(text=t, options=options) for t in TEXTS]
    for got, want in zip(other.translate(items), translator.translate(items), strict=True):
        assert_same_hypotheses(ok(got).hypotheses, ok(want).hypotheses)
    alone = other.translate(items[2:3])[0]
    assert_same_hypotheses(ok(alone).hypotheses, ok(translator.translate(items[2:3])[0]).hypotheses)


def assert_same_hypotheses(got: list[TranslationHypothesis], want: list[TranslationHypothesis]) -> None:
    assert [(h.text, h.tokens) for h in got] == [(h.text, h.tokens) for h in want]
    for a, b in zip(got, want, strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-5)
        assert a.alignment is not None and b.alignment is not None
        np.testing.assert_allclose(a.alignment, b.alignment, atol=1e-5)


def with_manifest_layout(artefact: Path, copy: Path, layout: str) -> Path:
    """A copy of ``artefact`` whose manifest names decoder layout ``layout``."""
    shutil.copytree(artefact, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["translation"]["decoder_layout"] = layout
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_a_layout_that_does_not_match_the_graph_is_refused(
    translation_artefact: Path, tmp_path: Path
) -> None:
    copy = with_manifest_layout(translation_artefact, tmp_path / "copy", "per_layer_kv_positions")
    with pytest.raises(ArtefactError, match="decoder_layout 'per_layer_kv_positions' does not match"):
        OnnxTranslator(copy, SessionConfig("cpu", 1))


@pytest.mark.parametrize("layout", ["stacked_kv", "stacked_kv_top_k", "per_layer_kv_top_k"])
def test_an_artefact_of_an_earlier_layout_is_refused_with_the_command_that_exports_it_again(
    translation_artefact: Path, tmp_path: Path, layout: str
) -> None:
    """Layouts earlier exports wrote are no longer served: loading names the layout and the
    export command for this model, its variant and its artefact root."""
    copy = with_manifest_layout(translation_artefact, tmp_path / "root" / "tiny-en-de" / "fp32", layout)
    with pytest.raises(ArtefactError) as refused:
        OnnxTranslator(copy, SessionConfig("cpu", 1))
    message = str(refused.value)
    assert f"decoder layout {layout!r}" in message and "no longer served" in message
    source = json.loads((copy / "manifest.json").read_text())["source"]["path"]
    command = f"python -m export {source} --name tiny-en-de --out {tmp_path / 'root'} --variant fp32"
    assert command in message
