"""An NLLB-style model: a tiny random M2M100ForConditionalGeneration whose language tokens are
NLLB's codes (``eng_Latn``) and whose tokenizer puts the source language after ``</s>`` (NLLB's
``legacy_behaviour``), exported with no pair named and served by ``python -m service``: listed by
the codes users send, reached by any of them, and translating as transformers' ``generate`` with
the same input and ``forced_bos_token_id``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess, artefact_env, server_process, service_command

NLLB = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"}
LIMIT = 10


@pytest.fixture(scope="module")
def nllb_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny_models.py's M2M-100 with its ``__xx__`` tokens renamed to NLLB's codes, and a
    tokenizer_config.json naming no pair, in the legacy layout."""
    pytest.importorskip("transformers")
    from tests.tiny_models import tiny_m2m100_dir

    directory = tiny_m2m100_dir(tmp_path_factory.mktemp("hf") / "tiny-nllb", seed=2)
    path = directory / "tokenizer.json"
    text = path.read_text(encoding="utf-8")
    for code, nllb in NLLB.items():
        text = text.replace(f'"__{code}__"', f'"{nllb}"')
    path.write_text(text, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"legacy_behaviour": True}), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def server(nllb_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from export.translation import export_translation

    root = tmp_path_factory.mktemp("artefacts")
    reference = root.with_name(f"{root.name}-reference.txt")  # the export's own checks: a few sentences
    reference.write_text("a man rides the big red bike .\ntwo dogs run\nthe red cat\n", encoding="utf-8")
    export_translation(nllb_source, root, ["fp32"], reference=reference)
    env = artefact_env(root) | {"TSERVE_TRANSLATE_MODEL": "tiny-nllb", "TSERVE_EMBED_MODEL": ""}
    with server_process(service_command(), env, tmp_path_factory.mktemp("server") / "server.log") as s:
        yield s


def test_the_nllb_codes_are_listed_as_users_send_them(server: ServerProcess) -> None:
    (card,) = httpx.get(f"{server.url}/v1/models").json()["data"]
    # no pair named: English into German is the verified one, listed first
    assert (card["source_languages"], card["target_languages"]) == (["en", "de", "fr"], ["de", "en", "fr"])
    languages = {entry["code"]: entry["targets"] for entry in httpx.get(f"{server.url}/languages").json()}
    assert languages == {"en": ["de", "fr"], "de": ["en", "fr"], "fr": ["de", "en"]}


@pytest.mark.parametrize(
    ("source", "target"), [("en", "fr"), ("deu_Latn", "eng_Latn"), ("fra", "de"), ("de", "fr_Latn")]
)
def test_every_code_of_a_pair_translates_as_transformers_generate(
    server: ServerProcess, nllb_source: Path, source: str, target: str
) -> None:
    from tokenizers import Tokenizer
    from transformers import M2M100ForConditionalGeneration

    from export.sources.hf_seq2seq import Seq2SeqReference
    from service.languages import canonical

    model = M2M100ForConditionalGeneration.from_pretrained(str(nllb_source)).eval()
    tokenizer = Tokenizer.from_file(str(nllb_source / "tokenizer.json"))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    token = {code: vocab[nllb] for code, nllb in NLLB.items()}
    text = "a man rides the big red bike ."
    ids = [*tokenizer.encode(text).ids, 2, token[canonical(source)]]  # legacy: the language after </s>
    reference = Seq2SeqReference(model, pad_id=1, eos_id=2, forced_first=token[canonical(target)])
    (want,) = reference.greedy([ids], [LIMIT])
    body = {
        "text": text,
        "source_language": source,
        "target_language": target,
        "beam_size": 1,
        "max_length": LIMIT,
        "alignments": True,
    }
    r = httpx.post(f"{server.url}/v1/translate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["source_language"], answer["target_language"]) == (canonical(source), canonical(target))
    sentence = answer["translations"][0]
    assert sentence["hypotheses"][0]["tokens"] == [tokenizer.id_to_token(i) for i in want]
    assert sentence["source_tokens"][-1] == NLLB[canonical(source)]  # the request's language on the input
