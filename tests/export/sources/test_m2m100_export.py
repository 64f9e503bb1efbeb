"""M2M-100 / NLLB import: a random M2M100ForConditionalGeneration exported, its graphs' log-probs
against transformers' and the served engine's greedy tokens against ``generate`` with
the target language's token forced first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from export.__main__ import detect_source
from export.translation import export_translation, load_source
from export.verify.translation_checks import encode_sources, open_engine, translate_ids
from service.artefacts import load_and_verify
from tests.tiny_models import tiny_m2m100_dir

TEXTS = [
    "a man rides the big red bike .",
    "two dogs run",
    "small cat sits on the street",
    "the red cat",
    "a dog",
    "big man",
]
LIMIT = 10


@pytest.fixture(scope="module")
def m2m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # seed 2: some sentences end at once (</s> right after the language token), others run to the limit
    return tiny_m2m100_dir(tmp_path_factory.mktemp("hf") / "m2m100-en-de", seed=2)


@pytest.fixture(scope="module")
def exported(m2m: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artefacts")
    reference = out / "reference.txt"  # the export's own checks on a few sentences: a fast test
    reference.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    (directory,) = export_translation(m2m, out, ["fp32"], reference=reference)
    return directory


def test_detected_as_m2m100(m2m: Path) -> None:
    assert detect_source(m2m).kind == "m2m100"


def test_manifest_describes_the_import(exported: Path, m2m: Path) -> None:
    manifest = load_and_verify(exported)
    vocab = json.loads((m2m / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert manifest.source.kind == "m2m100"
    assert (manifest.special_ids.pad, manifest.special_ids.bos, manifest.special_ids.eos) == (1, 2, 2)
    info = manifest.translation
    # every language both ways, the verified pair (tokenizer_config.json's) first
    assert info is not None and (info.source_languages, info.target_languages) == (
        ["en", "de", "fr"],
        ["de", "en", "fr"],
    )
    assert info.language_tokens == {code: vocab[f"__{code}__"] for code in ("en", "de", "fr")}
    assert manifest.parity["max_abs_log_probs"] <= 1e-4


def test_source_language_token_leads_the_input(m2m: Path) -> None:
    source = load_source(m2m)
    en = source.tokenizer.token_to_id("__en__")
    assert encode_sources(source, ["two dogs"])[0] == [en, *source.tokenizer.encode("two dogs").ids[1:-1], 2]


def test_served_greedy_tokens_equal_transformers_generate(exported: Path, m2m: Path) -> None:
    source = load_source(m2m)
    want = source.reference.greedy(encode_sources(source, TEXTS), [LIMIT] * len(TEXTS))
    got = translate_ids(open_engine(exported, threads=1), source, TEXTS, 1, limits=[LIMIT] * len(TEXTS))
    assert got == want
    assert len({tuple(t) for t in got}) > 1  # outputs depend on the source
