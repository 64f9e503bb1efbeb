"""Beam search through the served path (the exported ONNX graphs, the engine's translator and
search) gives the tokens of transformers' ``generate(num_beams=4)`` with the model's own
generation config: its ``early_stopping`` and ``length_penalty``, the target language's token
forced first. A random M2M-100 whose config says ``early_stopping="never"`` with a length
penalty, and a random NLLB-shaped model with NLLB's defaults (``early_stopping`` unset: False).
The search's rules against transformers' on every setting: test_hf_beam_search.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from export.sources.hf_seq2seq import Seq2SeqReference
from export.translation import export_translation, load_source
from export.verify.translation_checks import encode_sources, open_engine, translate_ids
from service.artefacts import load_and_verify
from tests.tiny_models import WORDS, tiny_m2m100_dir, tiny_nllb_dir

BEAM = 4


def _texts(n: int) -> list[str]:
    rng = random.Random(1)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 7))) for _ in range(n)]


TEXTS = _texts(16)
LIMITS = [(7, 12, 20)[i % 3] for i in range(len(TEXTS))]


@pytest.fixture(scope="module", params=["m2m100", "nllb"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    if request.param == "m2m100":
        generation = {"num_beams": 5, "early_stopping": "never", "length_penalty": 1.3}
        return tiny_m2m100_dir(root / "m2m100-en-de", seed=2, generation=generation)
    return tiny_nllb_dir(root / "nllb-en-de", seed=5)


@pytest.fixture(scope="module")
def exported(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artefacts")
    reference = out / "reference.txt"  # the export's own checks on a few sentences: a fast test
    reference.write_text("\n".join(_texts(8)) + "\n", encoding="utf-8")
    (directory,) = export_translation(model_dir, out, ["fp32"], reference=reference)
    return directory


def test_the_manifest_keeps_the_models_stopping_rule_and_penalty(exported: Path, model_dir: Path) -> None:
    info = load_and_verify(exported).translation
    assert info is not None
    if model_dir.name.startswith("m2m100"):
        assert (info.early_stopping, info.length_penalty) == ("never", 1.3)
    else:
        assert (info.early_stopping, info.length_penalty) == (False, 1.0)


def test_served_beam_tokens_equal_transformers_generate(exported: Path, model_dir: Path) -> None:
    source = load_source(model_dir)
    assert isinstance(source.reference, Seq2SeqReference)
    src_ids = encode_sources(source, TEXTS)
    want = [best for best, *_ in source.reference.generate(src_ids, LIMITS, num_beams=BEAM)]
    got = translate_ids(open_engine(exported, threads=1), source, TEXTS, BEAM, limits=LIMITS)
    assert got == want
    # the model's rule matters here: stopping at beam_size finished ones (ours before) differs
    first_k = source.reference.generate(src_ids, LIMITS, num_beams=BEAM, early_stopping=True)
    assert got != [best for best, *_ in first_k]
    assert len({tuple(t) for t in got}) > len(TEXTS) // 2  # outputs depend on the source
    assert any(len(t) < limit - 1 for t, limit in zip(got, LIMITS, strict=True))  # some end with </s>
