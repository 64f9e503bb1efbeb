"""Exporting our Transformer to the translation ONNX layout: parity, greedy tokens, manifest.

One tiny checkpoint (d_model 32, 2+2 layers), briefly trained to reverse word order so that its
outputs vary in length and end with </s>, is exported once (fp32 + int8, with a tiny eval
directory so the validation and BLEU paths run too) and shared by the tests, and by those of
exporting again over it (test_translation_re_export.py): tests/export/conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from export.graphs.top_k_blocks import choose_block
from export.graphs.translation_layout import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    POSITIONS_DECODER,
    SLOT_DECODER,
)
from export.sources.ours.checkpoint import load_checkpoint
from export.sources.ours.data import OUTPUT_LIMIT_RULE, encode_source, output_limits, pad
from export.sources.ours.model import padding_mask
from export.sources.ours.translate import translate_ids as torch_translate_ids
from export.translation import export_translation, load_source
from export.verify import VerificationError
from export.verify.determinism import translation_determinism
from export.verify.reference_set import MIN_CHRF_VS_FP32, load_reference
from export.verify.translation import FP32_TOLERANCE
from export.verify.translation_checks import BUILTIN_SENTENCES, engine_decoder, open_engine, translate_ids
from service.artefacts import (
    Manifest,
    load_and_verify,
    read_manifest,
)
from service.engine.translation.slots import SlotDecoder

TEXTS = ["a man rides a bike.", "two dogs run on the street.", "the big red cat sits.", "dogs"]


@pytest.fixture(scope="module")
def checkpoint(reversal_checkpoint: Path) -> Path:
    return reversal_checkpoint


@pytest.fixture(scope="module")
def exported(reversal_export: Path) -> Path:
    return reversal_export


def test_manifests_carry_layout_parity_and_fusions(exported: Path) -> None:
    """Both variants verify against their manifest; fp32 parity is within tolerance and the
    greedy checks ran on the built-in and validation sentences; int8 records its figures."""
    fp32 = load_and_verify(exported / "transformer-en-de" / "fp32")
    int8 = load_and_verify(exported / "transformer-en-de" / "int8")
    for m in (fp32, int8):
        assert m.task == "translate" and m.name == "transformer-en-de"
        assert [t.name for t in m.graphs["encoder"].inputs] == ENCODER_INPUTS
        assert [t.name for t in m.graphs["encoder"].outputs] == ENCODER_OUTPUTS
        assert m.translation is not None and m.translation.decoder_layout == SLOT_DECODER.layout
        assert m.translation.top_k_block == choose_block(m.vocab_size) is not None  # blocked candidates
        inputs, outputs = SLOT_DECODER.names(2)
        assert [t.name for t in m.graphs["decoder"].inputs] == inputs
        assert [t.name for t in m.graphs["decoder"].outputs] == outputs
        assert m.translation is not None and m.translation.has_alignments
        assert (m.translation.n_layers, m.translation.n_heads, m.translation.d_head) == (2, 4, 8)
        assert m.translation.source_languages == ["en"] and m.translation.target_languages == ["de"]
        assert (m.special_ids.pad, m.special_ids.bos, m.special_ids.eos, m.special_ids.unk) == (0, 1, 2, 3)
        assert m.opset >= 17 and m.onnxruntime_version
        assert {"max_abs_memory", "max_abs_log_probs", "max_abs_cross_attention"} <= set(m.parity)
        assert "bleu" in m.parity and "bleu_fp32" in m.parity
    assert max(fp32.parity[k] for k in ("max_abs_memory", "max_abs_log_probs")) <= FP32_TOLERANCE
    assert fp32.parity["greedy_builtin_sentences"] == len(BUILTIN_SENTENCES)
    assert fp32.parity["greedy_val_sentences"] == 6
    assert int8.parity["bleu_drop"] <= 0.5
    assert int8.fusions["MatMulIntegerToFloat"] > 0  # per-row int8, no per-tensor DynamicQuantize
    # the CPU variants keep the plain graph: SkipLayerNormalization's CPU kernel is the slower one
    assert fp32.fusions == {} and "SkipLayerNormalization" not in int8.fusions
    for variant in ("fp32", "int8"):
        for graph in ("encoder.onnx", "decoder.onnx"):
            nodes = onnx.load(str(exported / "transformer-en-de" / variant / graph)).graph.node
            assert "SkipLayerNormalization" not in {n.op_type for n in nodes}
    for m in (fp32, int8):  # measured on the committed reference sentences, bounds included
        check = m.reference_check
        assert check is not None and check.sha256 == load_reference().sha256 and check.sentences >= 200
        assert check.figures["alone_vs_batched_identical_beam1"] == 1.0
        assert check.figures["alone_vs_batched_identical_beam4"] == 1.0
        assert check.output_limit == OUTPUT_LIMIT_RULE  # each sentence's output capped, and said so
    assert int8.reference_check is not None
    assert int8.reference_check.figures["chrf_vs_fp32_beam4"] >= MIN_CHRF_VS_FP32
    assert int8.reference_check.bounds["min_chrf_vs_fp32_beam4"] == MIN_CHRF_VS_FP32
    decoder = {t.name: t for t in fp32.graphs["decoder"].inputs}
    presents = {t.name: t for t in fp32.graphs["decoder"].outputs}
    assert decoder["cache_keys_1"].shape == presents["present_keys_1"].shape == ["batch", 4, "cache_len", 8]
    assert decoder["memory_values_0"].shape == ["sentences", 4, "src_len", 8]  # once per sentence
    assert decoder["source_mask"].shape == ["sentences", "src_len"]
    assert decoder["sentence_rows"].shape == ["sentences", "width"]
    assert decoder["beam_index"].shape == ["batch"]
    assert decoder["cache_keys_1"].dtype == "float32" and decoder["input_ids"].dtype == "int64"
    assert decoder["positions"].shape == ["batch"]
    assert decoder["top_k"].shape == [1] and decoder["top_k"].dtype == "int64"


def test_service_engine_gives_the_same_tokens_as_pytorch(checkpoint: Path, exported: Path) -> None:
    """The artefact served by OnnxTranslator (loaded by the service's loader) equals TorchDecoder,
    greedy and beam."""
    model = load_checkpoint(checkpoint / "model.safetensors")
    source = load_source(checkpoint)
    texts = TEXTS + BUILTIN_SENTENCES[:4]
    src_ids = encode_source(source.tokenizer, texts, model.cfg.max_len)
    engine = open_engine(exported / "transformer-en-de" / "fp32", threads=1)
    limits = output_limits(src_ids, model.cfg.max_len)
    for beam in (1, 3):
        want = torch_translate_ids(model, src_ids, beam_size=beam)
        got = translate_ids(engine, source, texts, beam_size=beam, batch_size=3)
        assert got == want
    assert any(0 < len(t) < limit for t, limit in zip(want, limits, strict=True))  # some end with </s>


def test_first_step_with_empty_history(checkpoint: Path, exported: Path) -> None:
    """A step over empty slot caches runs; log_probs equal the model's first step, alignments are
    distributions over real source tokens, and the cache then holds the first column."""
    model = load_checkpoint(checkpoint / "model.safetensors")
    engine = open_engine(exported / "transformer-en-de" / "fp32", threads=1)
    src = pad(encode_source(load_source(checkpoint).tokenizer, TEXTS[:2], 48), 0)
    decoder, _ = engine_decoder(engine, src.numpy(), 0)
    assert isinstance(decoder, SlotDecoder)
    bos = np.full(2, model.cfg.bos_id, dtype=np.int64)
    mask = (src != 0).long().numpy()
    assert decoder.nbytes and not any(np.any(b) for b in decoder._cache)
    log_probs, attn = decoder.step(bos)
    assert attn is not None
    assert all(np.any(b[:, :, 0]) and not np.any(b[:, :, 1:]) for b in decoder._cache)  # written in place
    assert log_probs.dtype == np.float32 and log_probs.shape == (2, model.cfg.vocab_size)
    with torch.no_grad():
        mem_kv = model.memory_kv(model.encode(src))
        logits, _, ref_attn = model.decode(torch.from_numpy(bos)[:, None], mem_kv, padding_mask(src, 0))
    np.testing.assert_allclose(log_probs, logits[:, -1].log_softmax(-1).numpy(), atol=FP32_TOLERANCE)
    np.testing.assert_allclose(attn, ref_attn[:, -1].numpy(), atol=FP32_TOLERANCE)
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    assert np.all(attn[mask == 0] == 0)


def test_steps_over_the_same_rows_share_one_binding_not_their_outputs(
    checkpoint: Path, exported: Path
) -> None:
    """Steps over unchanged rows reuse one IO binding (the slot buffers change in place), yet
    each step's outputs are its own arrays and equal those of a binding made afresh."""
    bos = load_checkpoint(checkpoint / "model.safetensors").cfg.bos_id
    engine = open_engine(exported / "transformer-en-de" / "fp32", threads=1)
    src = pad(encode_source(load_source(checkpoint).tokenizer, TEXTS[:2], 48), 0).numpy()
    kept, fresh = engine_decoder(engine, src, 0)[0], engine_decoder(engine, src, 0)[0]
    assert isinstance(kept, SlotDecoder) and isinstance(fresh, SlotDecoder)
    tokens, earlier, bindings = np.full(2, bos, dtype=np.int64), [], set()
    for _ in range(3):
        got, attn = kept.step_candidates(tokens, 4)
        bindings.add(id(kept._binding))
        fresh._bound = None  # a new binding for every step, as before
        want, want_attn = fresh.step_candidates(tokens, 4)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.log_probs, want.log_probs)
        np.testing.assert_array_equal(attn, want_attn)
        earlier.append((got, attn, got.log_probs.copy(), np.array(attn, copy=True)))
        tokens = got.tokens[:, 0]
    assert len(bindings) == 1
    for got, attn, log_probs, attn_copy in earlier:  # not overwritten by the later runs
        np.testing.assert_array_equal(got.log_probs, log_probs)
        np.testing.assert_array_equal(attn, attn_copy)
    # another top_k, then no attention output: a binding of its own each time, the same scores
    for with_attention in (True, False):
        kept.with_attention = fresh.with_attention = with_attention
        got, attn = kept.step_candidates(tokens, 2)
        want, want_attn = fresh.step_candidates(tokens, 2)
        assert got.tokens.shape == (2, 2) and id(kept._binding) not in bindings
        bindings.add(id(kept._binding))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.log_probs, want.log_probs)
        assert (attn is None) == (not with_attention)
        if attn is not None:
            np.testing.assert_array_equal(attn, want_attn)
        tokens = got.tokens[:, 0]


def test_manifest_round_trip(exported: Path) -> None:
    directory = exported / "transformer-en-de" / "int8"
    manifest = read_manifest(directory)
    assert Manifest.model_validate_json(manifest.model_dump_json()) == manifest
    on_disk = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    assert Manifest.model_validate(on_disk) == manifest
    assert {f.path for f in manifest.files} == {"encoder.onnx", "decoder.onnx", "tokenizer.json"}


def test_failed_verification_writes_no_manifest(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("export.verify.translation.FP32_TOLERANCE", -1.0)
    with pytest.raises(VerificationError, match="differ from PyTorch"):
        export_translation(checkpoint, tmp_path, ["fp32"])
    assert not (tmp_path / "transformer-en-de" / "fp32").exists()
    assert list((tmp_path / "transformer-en-de").iterdir()) == []  # no partial directory left


def test_unknown_variant_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown variant 'int4'"):
        export_translation(checkpoint, tmp_path, ["int4"])


def test_name_defaults_to_the_directory_and_can_be_overridden(checkpoint: Path) -> None:
    """The artefact name gives the languages too (…-en-de); the CLI may pass its own."""
    assert load_source(checkpoint).name == "transformer-en-de"
    custom = load_source(checkpoint, "tiny-en-fr")
    assert custom.name == "tiny-en-fr"
    assert (custom.source_languages, custom.target_languages) == (["en"], ["fr"])


def test_reference_sentences_can_be_replaced(checkpoint: Path, tmp_path: Path) -> None:
    """--reference: the check runs on the given file (e.g. a model whose source is not English),
    and its hash decides whether an artefact is up to date; an empty or missing file is refused."""
    from export import __main__ as cli
    from service.artefacts import sha256_of

    reference = tmp_path / "reference.txt"
    reference.write_text("a man rides a bike.\n\ntwo dogs run on the street.\n", encoding="utf-8")
    argv = [str(checkpoint), "--out", str(tmp_path / "out"), "--variant", "fp32", "--threads", "1"]
    assert cli.main([*argv, "--reference", str(reference)]) == 0
    check = read_manifest(tmp_path / "out" / "transformer-en-de" / "fp32").reference_check
    assert check is not None and check.sentences == 2 and check.sha256 == sha256_of(reference)
    assert check.reference == str(reference)
    assert cli.main([*argv, "--reference", str(tmp_path / "missing.txt")]) == 2
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    assert cli.main([*argv, "--reference", str(tmp_path / "empty.txt")]) == 1


def test_the_decoders_top_k_gives_the_rows_best_tokens_beside_the_same_log_probs(
    checkpoint: Path, tmp_path: Path
) -> None:
    """The positions layout's decoder (fp16's, traced here in fp32): ``top_k`` → each row's best
    log-probs and tokens, best first, while ``log_probs`` are those of a step without candidates
    (``top_k`` 0); the graph has the layout's names and the manifest reader finds its layout."""
    import onnxruntime as ort

    from export.graphs.translation import decoder_layout, example_inputs, export_raw, tracing_step
    from service.artefacts import LOG_PROBS, TOP_K, TOP_LOG_PROBS, TOP_TOKENS, per_layer

    source = load_source(checkpoint)
    encoder, decoder = source.build_graphs(torch.float32, POSITIONS_DECODER.slots)
    export_raw(source, encoder, decoder, torch.float32, tmp_path, POSITIONS_DECODER)
    assert decoder_layout(tmp_path / "decoder.onnx") == POSITIONS_DECODER.layout
    session = ort.InferenceSession(str(tmp_path / "decoder.onnx"), providers=["CPUExecutionProvider"])
    inputs, outputs = POSITIONS_DECODER.names(source.n_layers)
    assert [i.name for i in session.get_inputs()] == inputs
    assert [o.name for o in session.get_outputs()] == outputs
    _, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, torch.float32, source.special.pad
    )
    traced = dict(zip(POSITIONS_DECODER.traced_inputs(), tracing_step(step, POSITIONS_DECODER), strict=True))
    feeds = {name: x.numpy() for name, x in traced.items() if name not in POSITIONS_DECODER.stacked_inputs()}
    for name in POSITIONS_DECODER.stacked_inputs():
        feeds.update({per_layer(name, i): traced[name][i].numpy() for i in range(source.n_layers)})
    names = [LOG_PROBS, TOP_LOG_PROBS, TOP_TOKENS]
    (want, _, _) = session.run(names, {**feeds, TOP_K: np.array([0], dtype=np.int64)})
    log_probs, values, tokens = session.run(names, {**feeds, TOP_K: np.array([6], dtype=np.int64)})
    np.testing.assert_array_equal(log_probs, want)
    assert values.shape == tokens.shape == (want.shape[0], 6)
    np.testing.assert_array_equal(values, -np.sort(-want, axis=1)[:, :6])
    np.testing.assert_array_equal(np.take_along_axis(want, tokens, 1), values)


def test_the_positions_decoder_takes_its_past_at_beam_rows_and_its_memory_at_memory_rows(
    checkpoint: Path, tmp_path: Path
) -> None:
    """The positions layout's graph reorders its own cache: a step over past rows and sentences
    named by ``beam_rows`` and ``memory_rows`` equals, bit for bit, the step over those rows'
    past and memory gathered beforehand and fed in row order (what a separate Gather run did)."""
    import onnxruntime as ort

    from export.graphs.translation import example_inputs, export_raw, tracing_step
    from service.artefacts import BEAM_ROWS, MEMORY_ROWS, SOURCE_MASK, TOP_K, per_layer

    source = load_source(checkpoint)
    encoder, decoder = source.build_graphs(torch.float32, POSITIONS_DECODER.slots)
    export_raw(source, encoder, decoder, torch.float32, tmp_path, POSITIONS_DECODER)
    session = ort.InferenceSession(str(tmp_path / "decoder.onnx"), providers=["CPUExecutionProvider"])
    _, step = example_inputs(
        source.n_layers, source.n_heads, source.d_head, source.vocab_size, torch.float32, source.special.pad
    )
    traced = dict(zip(POSITIONS_DECODER.traced_inputs(), tracing_step(step, POSITIONS_DECODER), strict=True))
    beam_rows, memory_rows = traced[BEAM_ROWS].numpy(), traced[MEMORY_ROWS].numpy()
    assert len(set(beam_rows.tolist())) < len(beam_rows) and len(set(memory_rows.tolist())) > 1
    by_row = {name: x.numpy() for name, x in traced.items() if name not in POSITIONS_DECODER.stacked_inputs()}
    in_order = {**by_row, BEAM_ROWS: np.arange(len(beam_rows)), MEMORY_ROWS: np.arange(len(memory_rows))}
    in_order[SOURCE_MASK] = by_row[SOURCE_MASK][memory_rows]
    for name in POSITIONS_DECODER.stacked_inputs():
        rows = memory_rows if name.startswith("memory") else beam_rows
        for i in range(source.n_layers):
            by_row[per_layer(name, i)] = traced[name][i].numpy()
            in_order[per_layer(name, i)] = traced[name][i].numpy()[rows]
    outputs = [o.name for o in session.get_outputs()]
    top_k = {TOP_K: np.array([4], dtype=np.int64)}
    got = session.run(outputs, {**by_row, **top_k})
    want = session.run(outputs, {**in_order, **top_k})
    for name, a, b in zip(outputs, got, want, strict=True):
        assert a.shape[0] == len(beam_rows), name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_reference_check_decoding_is_capped_per_sentence(exported: Path) -> None:
    """translation_determinism's max_lengths bound every output, alone and batched (what keeps a
    random-weights model, which never emits </s>, from decoding each sentence to the maximum)."""
    engine = open_engine(exported / "transformer-en-de" / "fp32", threads=1)
    texts = [*TEXTS, *BUILTIN_SENTENCES]
    limits = [1 + i % 3 for i in range(len(texts))]
    report = translation_determinism(engine, texts, beam_sizes=(1, 4), batch_sizes=(5, 3), max_lengths=limits)
    uncapped = translation_determinism(engine, texts, beam_sizes=(1,), batch_sizes=(5, 3))
    assert any(len(t) > 3 for t in uncapped.beams[1].alone)  # the cap is what shortens them
    for out in report.beams.values():
        for got in (out.alone, out.batched):
            assert all(len(t) <= n for t, n in zip(got, limits, strict=True))
        assert out.alone == out.batched
