"""NLLB's tokenizer in an M2M-100 / NLLB import: the source-language token where transformers'
NllbTokenizer puts it (first, or after </s> under ``legacy_behaviour``), a directory with only
``sentencepiece.bpe.model`` converted at export time, and an M2M-100 directory without a
tokenizer.json refused with a message saying what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
from transformers import AutoTokenizer

from export.sources.m2m100 import M2M100ImportError
from export.translation import export_translation, load_source
from export.verify.translation_checks import encode_sources, open_engine, translate_ids
from tests.tiny_models import tiny_m2m100_dir, tiny_nllb_dir

TEXTS = ["two dogs run", "a man rides the big red bike .", "the cat sits on the street", "zebra"]


def hf_ids(directory: Path, texts: list[str], src_lang: str = "eng_Latn") -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(str(directory), src_lang=src_lang)
    return [list(ids) for ids in tok(texts)["input_ids"]]


@pytest.mark.parametrize("legacy", [False, True])
def test_the_source_language_token_is_where_nllbs_tokenizer_puts_it(tmp_path: Path, legacy: bool) -> None:
    directory = tiny_nllb_dir(tmp_path / "nllb", legacy_behaviour=legacy)
    source = load_source(directory)
    got = [e.ids for e in source.tokenizer.encode_batch(TEXTS)]
    assert got == hf_ids(directory, TEXTS)
    eng, eos = source.tokenizer.token_to_id("eng_Latn"), source.special.eos
    assert all(ids[-2:] == [eos, eng] if legacy else (ids[0], ids[-1]) == (eng, eos) for ids in got)
    assert source.reference_encode is not None and source.reference_encode(TEXTS) == got


@pytest.fixture(scope="module")
def sentencepiece_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tiny_nllb_dir(tmp_path_factory.mktemp("hf") / "nllb-en-de", seed=5, legacy_behaviour=True)
    (directory / "tokenizer.json").unlink()
    return directory


def test_an_nllb_directory_with_only_its_sentencepiece_model_is_converted_at_export(
    sentencepiece_only: Path, tmp_path: Path
) -> None:
    reference = tmp_path / "reference.txt"  # the export's own checks on a few sentences: a fast test
    reference.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (exported,) = export_translation(sentencepiece_only, tmp_path, ["fp32"], reference=reference)
    source = load_source(sentencepiece_only)
    engine = open_engine(exported, threads=1)
    assert [e.ids for e in engine.encode(TEXTS)] == hf_ids(sentencepiece_only, TEXTS)
    limits = [12] * len(TEXTS)
    want = source.reference.greedy(encode_sources(source, TEXTS), limits)
    assert translate_ids(engine, source, TEXTS, 1, limits=limits) == want


def test_an_m2m100_directory_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    directory = tiny_m2m100_dir(tmp_path / "m2m100-en-de")
    (directory / "tokenizer.json").unlink()
    with pytest.raises(M2M100ImportError, match=r"no tokenizer\.json .*save_pretrained"):
        load_source(directory)
