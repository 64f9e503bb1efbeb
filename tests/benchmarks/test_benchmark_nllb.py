"""Stage ``nllb`` end to end on a tiny model of NLLB's layout: the random model and its tokenizer
built from a corpus, CTranslate2's int8 conversion, our int8 export, then the stage's table, every
system forcing ``deu_Latn`` first and producing 20 tokens a sentence."""

from __future__ import annotations

import argparse
import gzip
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from benchmarks import nllb
from benchmarks.harness import Bench
from benchmarks.nllb import NLLB_600M, NllbShape, nllb_language_codes
from benchmarks.preparation import prepare_nllb
from benchmarks.translation import BEAM4_BATCH32_FORCED, OURS_INT8
from benchmarks.translators import CT2_INT8, CT2_INT8_REPLICAS, CTranslate2, OursInProcess, TextCodec
from tests.tiny_models import WORDS

TINY = NllbShape("nllb-tiny-random", 32, 2, 4, 64, 64, trained_pieces=100, pieces=1000, rows_past_tokenizer=2)
GERMAN = ["ein", "mann", "fährt", "rad", "zwei", "hunde", "laufen", "auf", "der", "straße"]


def test_the_full_shape_has_nllb_600m_vocabulary_size() -> None:
    codes = nllb_language_codes()
    assert len(codes) == 202 and {"eng_Latn", "deu_Latn"} <= set(codes)
    # 256,000 pieces after fairseq's 4 specials (offset 1), the codes, <mask>, 2 rows past the tokenizer
    assert NLLB_600M.pieces + 1 + len(codes) + 1 + NLLB_600M.rows_past_tokenizer == 256_206


def write_multi30k(folder: Path) -> Path:
    rng = random.Random(0)
    for lang, words, n in (("en", WORDS, 300), ("de", GERMAN, 300)):
        lines = [" ".join(rng.choices(words, k=rng.randint(2, 9))).capitalize() + "." for _ in range(n)]
        with gzip.open(folder / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with gzip.open(folder / f"test_2016_flickr.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines[:40]) + "\n")
    return folder


def test_the_stage_measures_ours_against_ctranslate2_on_the_same_nllb_weights(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")  # the bench extra
    pytest.importorskip("sentencepiece")
    (tmp_path / "multi30k").mkdir()
    write_multi30k(tmp_path / "multi30k")
    args = argparse.Namespace(
        quick=True, threads=2, out=tmp_path / "out", data_dir=tmp_path, duration=None, rounds=1
    )
    bench = Bench(args)
    bench.nllb = paths = prepare_nllb(bench, TINY)
    assert bench.results.notes == [] and {"nllb/fp32", "nllb/int8"} <= set(bench.models)

    tokenizer = Tokenizer.from_file(str(paths["hf"] / "tokenizer.json"))
    codes = nllb_language_codes()
    assert tokenizer.token_to_id("deu_Latn") == TINY.pieces + 1 + codes.index("deu_Latn")
    assert tokenizer.token_to_id("<mask>") == TINY.pieces + 1 + len(codes)
    assert tokenizer.encode("A man rides.").tokens[0] == "eng_Latn"
    assert tokenizer.encode("A man rides.").tokens[-1] == "</s>"

    codec = TextCodec(tokenizer, eos_id=2, pad_id=1)
    texts, _ = bench.test_set(3)
    ct2 = CTranslate2(paths["ct2-int8"], codec, 1, CT2_INT8, target_prefix="deu_Latn")
    ours = OursInProcess(bench.models["nllb/int8"], 1, OURS_INT8)
    for system in (ct2, ours):  # the same work: 20 tokens, deu_Latn first among them
        outputs, n_tokens = system.translate(texts, BEAM4_BATCH32_FORCED)
        assert len(outputs) == 3 and n_tokens == 3 * 20, system.name
    first = [codec.tokens(codec.encode(texts[:1])[0])]
    with_prefix = ct2.tr.translate_batch(first, target_prefix=[["deu_Latn"]], max_decoding_length=5)
    assert with_prefix[0].hypotheses[0][0] == "deu_Latn"

    nllb.run(bench)
    rows = {row.system: row for row in bench.results.rows}
    assert set(rows) == {CT2_INT8, CT2_INT8_REPLICAS, OURS_INT8}  # no HF generate in a quick run
    assert all(row.value > 0 for row in rows.values())
    assert max(row.extra["x_ct2_int8"] for row in rows.values() if row.system != OURS_INT8) == 1.0
    assert rows[OURS_INT8].extra["x_ct2_int8"] > 0
    assert "forced 20 tok" in rows[OURS_INT8].section and "32 sent." in rows[OURS_INT8].section
    assert bench.results.notes == []
