"""Exporting our Transformer to the translation ONNX layout: parity, greedy tokens, manifest.

One tiny checkpoint (d_model 32, 2+2 layers), briefly trained to reverse word order so that its
outputs vary in length and end with </s>, is exported once (fp32 + int8, with a tiny eval
directory so the validation and BLEU paths run too) and shared by the tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from export.graphs.int8_rowwise import WEIGHT_MAX
from export.graphs.top_k_blocks import block_size, choose_block
from export.graphs.translation_layout import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    POSITIONS_DECODER,
    SLOT_DECODER,
)
from export.sources import GENERATION_CONFIG
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
    BEAM_INDEX,
    INT8_WEIGHT_BITS,
    SENTENCE_ROWS,
    ArtefactError,
    Manifest,
    decoder_layout_of,
    load_and_verify,
    read_manifest,
)
from service.engine.translation.slots import SlotDecoder
from service.serving.startup import is_stale
from tests.tiny_models import reversal_pairs, tiny_translation_checkpoint

TEXTS = ["a man rides a bike.", "two dogs run on the street.", "the big red cat sits.", "dogs"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``transformer-en-de/model.safetensors`` + tokenizer.json, trained 40 steps on reversal."""
    directory = tmp_path_factory.mktemp("ckpt") / "transformer-en-de"
    return tiny_translation_checkpoint(
        directory, max_len=48, vocab_size=80, n_heads=4, n_encoder_layers=2, n_decoder_layers=2
    )


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few validation and test lines, so the export's greedy-on-val and BLEU checks run."""
    d = tmp_path_factory.mktemp("eval")
    sources, targets = reversal_pairs(12)
    (d / "val.en").write_text("\n".join(sources[:6]) + "\n", encoding="utf-8")
    (d / "test_2016_flickr.en").write_text("\n".join(sources[6:]) + "\n", encoding="utf-8")
    (d / "test_2016_flickr.de").write_text("\n".join(targets[6:]) + "\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def exported(checkpoint: Path, eval_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artefacts")
    dirs = export_translation(checkpoint, out, ["fp32", "int8"], eval_dir=eval_dir)
    assert dirs == [out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"]
    return out


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


def test_rerun_skips_until_an_artefact_is_corrupted(checkpoint: Path, exported: Path, tmp_path: Path) -> None:
    """Same weights: nothing is rebuilt. A corrupted decoder.onnx is named by load_and_verify, and
    the next export rebuilds that variant only."""
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    fp32, int8 = out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"
    before = {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)}
    export_translation(checkpoint, out, ["fp32", "int8"])
    assert {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)} == before

    data = bytearray((fp32 / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (fp32 / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match=r"decoder\.onnx"):
        load_and_verify(fp32)

    export_translation(checkpoint, out, ["fp32", "int8"])
    load_and_verify(fp32)
    assert (int8 / "manifest.json").stat().st_mtime_ns == before[int8]
    assert sorted(p.name for p in (out / "transformer-en-de").iterdir()) == ["fp32", "int8"]


@pytest.mark.parametrize(
    ("field", "before"),
    [("decoder_layout", "stacked_kv"), ("top_k_block", None)],
    ids=["older decoder layout", "single TopK"],
)
def test_an_older_artefact_still_reads_and_is_re_exported(
    checkpoint: Path, exported: Path, tmp_path: Path, field: str, before: str | None
) -> None:
    """An artefact of an earlier decoder layout (which the service refuses, naming the command
    that re-exports it), or from before the candidates by blocks (a single TopK, the same
    output), still reads and verifies, and the next export replaces it (that variant only)."""
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    fp32, int8 = out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"
    manifest = json.loads((int8 / "manifest.json").read_text())
    manifest["translation"][field] = before  # as exported before the field (or its value)
    (int8 / "manifest.json").write_text(json.dumps(manifest))
    assert load_and_verify(int8).translation is not None
    stamps = {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)}
    export_translation(checkpoint, out, ["fp32", "int8"])
    assert (fp32 / "manifest.json").stat().st_mtime_ns == stamps[fp32]
    rebuilt = load_and_verify(int8).translation
    assert rebuilt is not None and rebuilt.decoder_layout == SLOT_DECODER.layout
    assert rebuilt.top_k_block is not None and rebuilt.top_k_block == block_size(int8 / "decoder.onnx")


def test_an_int8_artefact_of_8_bit_weights_is_re_exported_with_7(
    checkpoint: Path, exported: Path, tmp_path: Path
) -> None:
    """int8 weights of 8 bits saturate onnxruntime's u8×s8 kernels on CPUs without VNNI: an
    artefact from before INT8_WEIGHT_BITS (no int8_weight_bits) is stale for the export and for the
    service's start, and the next export writes 7-bit weights (|w| ≤ 63 in every MatMul)."""
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    fp32, int8 = out / "transformer-en-de" / "fp32", out / "transformer-en-de" / "int8"
    assert (
        load_and_verify(int8).int8_weight_bits == INT8_WEIGHT_BITS
        and load_and_verify(fp32).int8_weight_bits is None
    )
    manifest = json.loads((int8 / "manifest.json").read_text())
    del manifest["int8_weight_bits"]
    (int8 / "manifest.json").write_text(json.dumps(manifest))
    assert is_stale(int8) and not is_stale(fp32)
    stamps = {p: (p / "manifest.json").stat().st_mtime_ns for p in (fp32, int8)}
    export_translation(checkpoint, out, ["fp32", "int8"])
    assert (fp32 / "manifest.json").stat().st_mtime_ns == stamps[fp32]
    assert load_and_verify(int8).int8_weight_bits == INT8_WEIGHT_BITS and not is_stale(int8)
    graph = onnx.load(str(int8 / "decoder.onnx"))
    weights = [
        numpy_helper.to_array(t) for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8
    ]
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= WEIGHT_MAX


def test_a_slot_artefact_from_before_the_memory_per_sentence_is_refused_and_re_exported(
    checkpoint: Path, exported: Path, tmp_path: Path
) -> None:
    """A slot decoder without sentence_rows / beam_index (memory per row) cannot be served: the
    service says to export again, and the next export does."""
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    int8 = out / "transformer-en-de" / "int8"
    manifest = json.loads((int8 / "manifest.json").read_text())
    decoder = manifest["graphs"]["decoder"]
    decoder["inputs"] = [t for t in decoder["inputs"] if t["name"] not in (SENTENCE_ROWS, BEAM_INDEX)]
    (int8 / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtefactError, match="export the model again"):
        decoder_layout_of(t["name"] for t in decoder["inputs"])
    export_translation(checkpoint, out, ["int8"])
    rebuilt = load_and_verify(int8)
    assert {SENTENCE_ROWS, BEAM_INDEX} <= {t.name for t in rebuilt.graphs["decoder"].inputs}


def test_the_generation_configs_length_penalty_goes_into_the_manifest(
    checkpoint: Path, exported: Path, tmp_path: Path
) -> None:
    """generation_config.json beside the checkpoint sets the artefact's default length penalty;
    a changed one re-exports (the weights are the same), none means 1.0, a bad one is refused."""
    assert _length_penalty(exported / "transformer-en-de" / "fp32") == 1.0
    source = tmp_path / "transformer-en-de"
    shutil.copytree(checkpoint.parent if checkpoint.is_file() else checkpoint, source)
    out = tmp_path / "artefacts"
    shutil.copytree(exported, out)
    fp32 = out / "transformer-en-de" / "fp32"
    (source / GENERATION_CONFIG).write_text('{"length_penalty": 1.3, "num_beams": 4}')
    export_translation(source, out, ["fp32"])
    assert _length_penalty(fp32) == 1.3
    (source / GENERATION_CONFIG).write_text('{"length_penalty": 2.5}')
    with pytest.raises(ValueError, match=r"length_penalty must be a number in \[0, 2\]"):
        export_translation(source, out, ["fp32"])
    assert _length_penalty(fp32) == 1.3  # the earlier artefact is kept


def _length_penalty(directory: Path) -> float:
    info = load_and_verify(directory).translation
    assert info is not None
    return info.length_penalty


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
