"""Language codes: every NLLB-200 code listed once by the code users send, and every code a user
may send for a language turned into that one."""

from __future__ import annotations

import langcodes
import pytest

from service.artefacts import TranslationInfo
from service.languages import ModelLanguages, canonical
from service.languages_nllb import NLLB_200


def test_every_nllb_code_is_listed_by_a_code_of_its_own_language() -> None:
    assert len(NLLB_200) == 202
    assert len(set(NLLB_200.values())) == 202  # no two NLLB languages share a listed code
    for nllb, listed in NLLB_200.items():
        language, script = nllb.split("_")
        tag = langcodes.Language.get(listed, normalize=False)
        assert tag.is_valid(), listed
        # the listed code is the NLLB language's own, or the macrolanguage it belongs to
        assert tag.to_alpha3() == language or listed in _MACROLANGUAGES, (nllb, listed)
        assert tag.script in (None, script), (nllb, listed)


# the macrolanguage codes users send for NLLB's individual languages (Standard Arabic → ar, …)
_MACROLANGUAGES = {
    "ar", "ms", "sw", "fa", "fa-AF", "lv", "mn", "ne", "or", "uz", "mg", "om", "az", "sq", "qu",
    "yi", "ps", "kr", "kr-Arab", "ku", "ay", "ff",
}  # fmt: skip


@pytest.mark.parametrize(
    ("sent", "listed"),
    [
        ("deu_Latn", "de"),
        ("deu-Latn", "de"),
        ("deu", "de"),
        ("ger", "de"),
        ("de", "de"),
        ("eng_Latn", "en"),
        ("arb_Arab", "ar"),
        ("arb", "ar"),
        ("ara", "ar"),
        ("zho_Hans", "zh"),
        ("zho", "zh"),
        ("zho_Hant", "zh-Hant"),
        ("zh-hant", "zh-Hant"),
        ("zh-Hans", "zh"),
        ("de-Latn", "de"),
        ("ace_Arab", "ace-Arab"),
        ("ace", "ace"),
        ("prs_Arab", "fa-AF"),
        ("bre", "br"),  # M2M-100's Breton, not in NLLB: ISO 639-2 → 639-1 by langcodes
        ("pt-BR", "pt-BR"),  # anything else as it is
        ("xx", "xx"),
    ],
)
def test_any_code_of_a_language_becomes_its_listed_code(sent: str, listed: str) -> None:
    assert canonical(sent) == listed


def _info(codes: list[str], tokens: dict[str, int]) -> TranslationInfo:
    return TranslationInfo(
        source_languages=codes,
        target_languages=[*codes[1:], codes[0]],
        n_layers=1,
        n_heads=1,
        d_head=4,
        max_source_len=8,
        max_target_len=8,
        has_alignments=False,
        language_tokens=tokens,
    )


def test_a_multilingual_model_lists_its_languages_by_listed_code_with_their_tokens() -> None:
    languages = ModelLanguages.of(
        _info(["eng_Latn", "deu_Latn", "fra_Latn"], {"eng_Latn": 7, "deu_Latn": 8, "fra_Latn": 9})
    )
    assert (languages.sources, languages.targets) == (["en", "de", "fr"], ["de", "fr", "en"])
    assert languages.multilingual and languages.token("de") == 8 and languages.token("es") is None
    assert languages.describe() == "any two of de, en, fr"


def test_a_model_of_one_pair_has_no_tokens_and_names_its_pair() -> None:
    languages = ModelLanguages.of(_info(["en", "de"], {}))
    assert not languages.multilingual and languages.token("de") is None
    assert languages.describe() == "en→de, de→en"
