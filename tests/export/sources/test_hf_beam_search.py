"""The project's beam search (service/engine/translation/search.py) over transformers' own cached forward
gives the tokens of transformers' ``generate(num_beams=4)``: which hypotheses finish, how they are
scored under a length penalty and when a sentence stops, for each of Hugging Face's
``early_stopping`` settings, on a random M2M-100 (the target language's token forced first)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from export.sources.hf_seq2seq import Seq2SeqReference
from export.translation import load_source
from export.verify.translation_checks import encode_sources
from service.engine.translation.search_loop import beam_search
from service.engine.translation.sentence_search import EarlyStopping
from tests.tiny_models import WORDS, tiny_m2m100_dir

BEAM = 4
LIMITS = (6, 11)  # a short one cuts most hypotheses off; a longer one lets most finish


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Seq2SeqReference, list[list[int]]]:
    source = load_source(tiny_m2m100_dir(tmp_path_factory.mktemp("hf") / "m2m100-en-de", seed=2))
    reference = source.reference
    assert isinstance(reference, Seq2SeqReference)
    return reference, encode_sources(source, _texts(12))


def ours(
    reference: Seq2SeqReference, src_ids: list[list[int]], limits: list[int], **options: Any
) -> list[list[list[int]]]:
    width = max(len(ids) for ids in src_ids)
    src = torch.tensor([ids + [reference.pad_id] * (width - len(ids)) for ids in src_ids])
    found = beam_search(
        reference.decoder(src),
        len(src_ids),
        beam_size=BEAM,
        max_len=limits,
        bos_id=int(reference.model.config.decoder_start_token_id),
        eos_id=reference.eos_id,
        forced_first=reference.forced_first,
        **options,
    )
    return [[h.tokens for h in hyps] for hyps in found]


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.6, 1.6])
def test_beam_tokens_equal_generate(
    reference: tuple[Seq2SeqReference, list[list[int]]], early_stopping: EarlyStopping, length_penalty: float
) -> None:
    ref, src_ids = reference
    limits = [LIMITS[i % 2] for i in range(len(src_ids))]
    options = {"length_penalty": length_penalty, "early_stopping": early_stopping}
    want = ref.generate(src_ids, limits, num_beams=BEAM, num_return_sequences=2, **options)
    assert ours(ref, src_ids, limits, n_best=2, **options) == want


def test_the_stopping_rule_changes_the_tokens(reference: tuple[Seq2SeqReference, list[list[int]]]) -> None:
    """Why the rule is the model's: on these sentences the rules disagree, so a search that
    ignored it could not match ``generate`` under all of them."""
    ref, src_ids = reference
    limits = [LIMITS[1]] * len(src_ids)
    stopped = {str(rule): ours(ref, src_ids, limits, early_stopping=rule) for rule in (True, False)}
    assert stopped["True"] != stopped["False"]
