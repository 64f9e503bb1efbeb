"""Importing a Hugging Face MarianMTModel into the translation ONNX layout.

A tiny random Marian (d_model 32, 2+2 layers, ~90 pieces) is saved with real MarianTokenizer
files (two SentencePiece models trained here, offline, on a few sentences, and a shared
vocab.json), exported, and its ONNX greedy output compared with transformers' ``generate``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("sentencepiece")
import sentencepiece as spm
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

from export.sources.hf_seq2seq import Seq2SeqReference
from export.sources.marian import MarianImportError
from export.sources.marian.tokenizer import convert_marian_tokenizer
from export.translation import export_translation, load_source
from export.verify.translation_checks import BUILTIN_SENTENCES, encode_sources, open_engine, translate_ids
from service.artefacts import load_and_verify
from tests.tiny_models import TINY_BART_SIZES

EN = [
    "A man is riding a bike.",
    "Two dogs play in the snow.",
    "A woman reads a book in the park.",
    "Children are playing football on the grass.",
    "The cat sleeps on the red sofa.",
    "A group of people is standing in front of a building.",
    "A little girl climbs a tree.",
    "Three men are working on a roof.",
    "A dog runs along the beach.",
    "People walk down a busy street.",
]
DE = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf dem Rasen.",
    "Die Katze schläft auf dem roten Sofa.",
    "Eine Gruppe von Menschen steht vor einem Gebäude.",
    "Ein kleines Mädchen klettert auf einen Baum.",
    "Drei Männer arbeiten auf einem Dach.",
    "Ein Hund läuft am Strand entlang.",
    "Menschen gehen eine belebte Straße entlang.",
]
MAX_NEW = 12


def _train_spm(texts: list[str], path: Path) -> list[str]:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=60,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    path.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def build_tiny_marian(directory: Path) -> tuple[MarianTokenizer, MarianMTModel]:
    """Marian's layout: </s> = 0, <unk> = 1, source and target pieces, <pad> last (decoder start)."""
    directory.mkdir(parents=True)
    pieces = _train_spm(EN, directory / "source.spm") + _train_spm(DE, directory / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = pad = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tok = MarianTokenizer(
        str(directory / "source.spm"),
        str(directory / "target.spm"),
        str(directory / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    tok.save_pretrained(str(directory))
    cfg = MarianConfig(
        vocab_size=len(vocab),
        **TINY_BART_SIZES,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
        activation_function="swish",
        scale_embedding=True,
    )
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():  # weights large enough for source-dependent outputs; positions untouched
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.normal_(0.0, 0.35)
        model.final_logits_bias.normal_(0.0, 0.3)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        decoder_start_token_id=pad,
        eos_token_id=0,
        pad_token_id=pad,
        max_length=64,
    )
    model.save_pretrained(str(directory))
    return tok, model


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MarianTokenizer, MarianMTModel]:
    directory = tmp_path_factory.mktemp("hf") / "opus-mt-en-de"
    tok, model = build_tiny_marian(directory)
    return directory, tok, model


@pytest.fixture(scope="module")
def exported(
    marian: tuple[Path, MarianTokenizer, MarianMTModel], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("artefacts")
    reference = out / "reference.txt"  # the export's own checks on a few sentences: a fast test
    reference.write_text("\n".join(EN) + "\n", encoding="utf-8")
    (directory,) = export_translation(marian[0], out, ["fp32"], reference=reference)
    return directory


def test_manifest_describes_the_marian_import(
    exported: Path, marian: tuple[Path, MarianTokenizer, MarianMTModel]
) -> None:
    manifest = load_and_verify(exported)
    vocab = json.loads((marian[0] / "vocab.json").read_text(encoding="utf-8"))
    assert exported.parent.name == manifest.name == "opus-mt-en-de"
    assert manifest.source.kind == "marian" and manifest.vocab_size == len(vocab)
    pad = vocab["<pad>"]
    assert (manifest.special_ids.pad, manifest.special_ids.bos, manifest.special_ids.eos) == (pad, pad, 0)
    assert manifest.translation is not None and manifest.translation.source_languages == ["en"]
    assert manifest.parity["max_abs_log_probs"] <= 1e-4
    assert manifest.parity["greedy_builtin_sentences"] == len(BUILTIN_SENTENCES)


def test_converted_tokenizer_encodes_like_marian_tokenizer(
    exported: Path, marian: tuple[Path, MarianTokenizer, MarianMTModel]
) -> None:
    """The artefact's tokenizer.json (converted; no sentencepiece needed) gives MarianTokenizer's
    ids, </s> included, and decodes them back to the same text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(exported / "tokenizer.json"))
    hf = marian[1]
    texts = EN + BUILTIN_SENTENCES + ["  extra   spaces  ", "Ünïcödé wörds?"]
    want = hf(texts)["input_ids"]
    assert [e.ids for e in tok.encode_batch(texts)] == want
    assert tok.decode_batch(want) == hf.batch_decode(want, skip_special_tokens=True)


def test_onnx_greedy_equals_transformers_generate(
    exported: Path, marian: tuple[Path, MarianTokenizer, MarianMTModel]
) -> None:
    _, hf_tok, model = marian
    batch = hf_tok(EN, return_tensors="pt", padding=True)
    with torch.no_grad():
        hf_model: Any = model  # transformers' annotations reject MarianMTModel as generate's self
        generated = hf_model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)
    want = []
    for row in generated[:, 1:].tolist():  # without the decoder start token, up to </s>
        want.append(row[: row.index(0)] if 0 in row else row)

    source = load_source(marian[0])
    got = translate_ids(open_engine(exported, threads=1), source, EN, 1, limits=[MAX_NEW] * len(EN))
    assert got == want
    assert len({tuple(t) for t in got}) > 1  # outputs depend on the source


def test_directory_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MarianImportError, match=r"no tokenizer.json and no MarianTokenizer files"):
        convert_marian_tokenizer(tmp_path)


def test_separate_vocabularies_are_refused(
    marian: tuple[Path, MarianTokenizer, MarianMTModel], tmp_path: Path
) -> None:
    for name in ("source.spm", "vocab.json"):
        (tmp_path / name).write_bytes((marian[0] / name).read_bytes())
    (tmp_path / "target_vocab.json").write_text("{}", encoding="utf-8")
    with pytest.raises(MarianImportError, match="separate source/target vocabularies"):
        convert_marian_tokenizer(tmp_path)


def test_onnx_beam_equals_transformers_generate_under_the_artefacts_stopping_rule(
    exported: Path, marian: tuple[Path, MarianTokenizer, MarianMTModel]
) -> None:
    """Marian artefacts stop a beam search at beam_size finished hypotheses (early_stopping
    True, as before the field); under that rule the served beam-4 tokens are generate's, the
    pad token suppressed as its bad_words_ids say."""
    source = load_source(marian[0])
    info = load_and_verify(exported).translation
    assert info is not None and info.early_stopping is True
    assert isinstance(source.reference, Seq2SeqReference)
    limits = [MAX_NEW] * len(EN)
    found = source.reference.generate(
        encode_sources(source, EN),
        limits,
        num_beams=4,
        early_stopping=True,
        length_penalty=source.length_penalty,
    )
    got = translate_ids(open_engine(exported, threads=1), source, EN, 4, limits=limits)
    assert got == [best for best, *_ in found]
