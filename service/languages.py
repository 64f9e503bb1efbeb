"""Language codes: the ones users send, the ones models name, and one listed code per language.

Users send ISO 639-1 codes (``de``) or ISO 639-2/-3 ones (``deu``, ``ger``); NLLB names its
languages ``deu_Latn``, M2M-100 ``__de__`` (its manifest keeps ``de``), our models and Marian's
``de``. Every code is turned into the one a language is listed by (``canonical``): that is what
``/languages``, ``/v1/models`` and error messages show, and what requests are matched on, so a
request for ``deu`` reaches a model that names the language ``deu_Latn`` or ``de`` alike. The
NLLB codes' listing is data (``languages_nllb.py``); ISO 639-2/-3 → 639-1 is langcodes'.

``ModelLanguages`` is one translation model's languages in listed codes, with a multilingual
model's language tokens (the manifest's ``language_tokens``: the token forced first for a
target language, and put on the input for a source language).
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass

import langcodes

from service.artefacts import TranslationInfo
from service.languages_nllb import NLLB_200


def canonical(code: str) -> str:
    """The code ``code``'s language is listed by: an NLLB code's listing (``deu_Latn`` → ``de``,
    ``zho_Hant`` → ``zh-Hant``), a listed code in any case (``zh-hant`` → ``zh-Hant``), the
    language part of an NLLB code (``arb`` → ``ar``, ``deu`` → ``de``), an ISO 639-2/-3 code of a
    language with an ISO 639-1 one (``ger`` → ``de``); any other code as it is (``pt-BR``)."""
    key = code.replace("-", "_").lower()
    found = _aliases().get(key)
    if found is not None:
        return found
    return _iso639_1().get(key, code)


@functools.cache
def _aliases() -> dict[str, str]:
    """NLLB codes, the listed codes, and the NLLB codes' language parts and BCP 47 tags with
    the usual script (lower case, ``_`` for ``-``) → the listed code: ``zho`` and ``zh-Hans``
    are ``zh``, ``zh-Hant`` is itself."""
    aliases: dict[str, str] = {}
    for nllb, listed in NLLB_200.items():
        aliases[nllb.lower()] = listed
        aliases[listed.replace("-", "_").lower()] = listed
        if "-" not in listed:
            language, script = nllb.lower().split("_")
            aliases[language] = aliases[f"{listed}_{script}".lower()] = listed
    return aliases


@functools.cache
def _iso639_1() -> dict[str, str]:
    """ISO 639-2 (T and B) and 639-3 codes → the ISO 639-1 code of the same language."""
    found: dict[str, str] = {}
    for first in string.ascii_lowercase:
        for second in string.ascii_lowercase:
            code = first + second
            try:
                language = langcodes.Language.get(code, normalize=False)
                for variant in ("T", "B"):
                    found.setdefault(language.to_alpha3(variant=variant), code)
            except LookupError:  # not an ISO 639-1 code
                continue
    return found


@dataclass(frozen=True)
class ModelLanguages:
    """A translation model's languages in listed codes, its default pair first (the manifest's
    first source and first target), and a multilingual model's language tokens by listed code."""

    sources: list[str]
    targets: list[str]
    tokens: dict[str, int]

    @classmethod
    def of(cls, info: TranslationInfo | None) -> ModelLanguages:
        if info is None:
            return cls([], [], {})
        return cls(
            sources=_listed(info.source_languages),
            targets=_listed(info.target_languages),
            tokens={canonical(code): token for code, token in info.language_tokens.items()},
        )

    @property
    def multilingual(self) -> bool:
        """Whether the target language is chosen per request (by its forced token), rather than
        being the model's one."""
        return len(self.tokens) > 1

    def token(self, language: str) -> int | None:
        """A multilingual model's token for ``language`` (a listed code); None for one it has no
        token of, or a model without language tokens."""
        return self.tokens.get(language)

    def pairs(self) -> list[str]:
        return [f"{s}→{t}" for s in self.sources for t in self.targets if s != t]

    def describe(self) -> str:
        """Its pairs, or for a multilingual model its languages (40,000 pairs would name none)."""
        if not self.multilingual:
            return ", ".join(self.pairs())
        if set(self.sources) == set(self.targets):
            return f"any two of {', '.join(sorted(self.sources))}"
        return f"any of {', '.join(sorted(self.sources))} into any of {', '.join(sorted(self.targets))}"


def _listed(codes: list[str]) -> list[str]:
    return list(dict.fromkeys(canonical(c) for c in codes))
