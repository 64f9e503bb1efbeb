"""Which served model answers a request: a translation model by name or by language pair, the
embedding model, the rerank model.

The choice is made here once for every API; what differs between APIs is a policy (whether a
client can name a model, and so must settle a pair two models serve), and how each words a
refusal (``UnservedLanguages``). A source language left to the service ("auto") is detected in
each text first (``detection.py``), then routed like a named one.
"""

from __future__ import annotations

from typing import Literal

from service.serving.failures import InvalidRequest, ModelNotFound, problem
from service.serving.runtime import EmbeddingModel, Runtime, TranslationModel

# Why no one model serves the languages asked for.
Unserved = Literal["source", "target", "pair", "several"]


class UnservedLanguages(InvalidRequest):
    """No served model translates ``source`` into ``target`` (None: not given), or several do.
    A 422 naming the field to change, listing the served pairs (``served``) and, when several
    models or source languages fit, ``candidates``."""

    def __init__(
        self, reason: Unserved, source: str | None, target: str | None, served: str, candidates: list[str]
    ) -> None:
        self.reason = reason
        self.source = source
        self.target = target
        self.served = served
        self.candidates = candidates
        field, message = self._field_and_message()
        kind = (
            "unsupported_language_pair"
            if reason in ("source", "target", "pair")
            else "ambiguous_language_pair"
        )
        super().__init__([problem(kind, (field,), f"{message} (served pairs: {served})", served)])

    def _field_and_message(self) -> tuple[str, str]:
        source, target, candidates = self.source, self.target, ", ".join(self.candidates)
        if self.reason == "source":
            return "source_language", f"{source!r} is not served as a source language"
        if self.reason == "target":
            return "target_language", f"{target!r} is not served as a target language"
        if self.reason == "pair":
            return "target_language", f"{source!r} → {target!r} is not served"
        field = "target_language" if target is not None else "source_language"
        return field, f"{candidates} all translate this: name one in 'model'"


def choose_translation_model(
    runtime: Runtime,
    model: str | None,
    source: str | None,
    target: str | None,
    *,
    first_of_several: bool = False,
) -> TranslationModel:
    """The model named ``model``, else the one translating ``source`` into ``target`` (None:
    any; any code of a language, ``service/languages.py``), else with neither language the
    default (the first configured). A model of a few pairs goes before a multilingual one serving
    the same pair. 404 for a model not served; 422 (``UnservedLanguages``) for languages no model
    serves, or several do unless ``first_of_several`` (for clients that cannot name a model: the
    first configured wins)."""
    default = translation_models(runtime)[0]
    if model is not None:
        if model not in runtime.translation_models:
            served = ", ".join(runtime.translation_models)
            raise ModelNotFound(f"the model {model!r} is not served here; translators: {served}")
        return runtime.translation_models[model]
    if source is None and target is None:
        return default
    matches = _specialised_first(runtime.translation_models_for(source, target))
    if len(matches) == 1 or (matches and first_of_several):
        return matches[0]
    served = ", ".join(runtime.served_pairs())  # only for the refusal: a multilingual model's is long
    if matches:
        raise UnservedLanguages("several", source, target, served, [t.name for t in matches])
    if source is not None and not runtime.translation_models_for(source, None):
        raise UnservedLanguages("source", source, target, served, [])
    if target is not None and not runtime.translation_models_for(None, target):
        raise UnservedLanguages("target", source, target, served, [])
    raise UnservedLanguages("pair", source, target, served, [])


def _specialised_first(matches: list[TranslationModel]) -> list[TranslationModel]:
    """A pair both a model of a few pairs and a multilingual one serve goes to the former, which
    was made for it (docs/decisions.md, "A pair goes to its own model before a multilingual one")."""
    return [t for t in matches if not t.languages.multilingual] or matches


def translation_models(runtime: Runtime) -> list[TranslationModel]:
    """Every translation model, the default (the first configured) first; 404 when none is."""
    if not runtime.translation_models:
        raise ModelNotFound("no translation model is loaded (TSERVE_TRANSLATE_MODELS is empty)")
    return list(runtime.translation_models.values())


def choose_embedding_model(runtime: Runtime, model: str | None = None) -> EmbeddingModel:
    """The embedding model (one at most is served), when ``model`` is unnamed or names it; else 404."""
    if runtime.embedding_model is None:
        raise ModelNotFound("no embedding model is loaded (TSERVE_EMBED_MODEL is empty)")
    name = runtime.embedding_model.engine.manifest.name
    if model is not None and model != name:
        raise ModelNotFound(f"the model {model!r} does not exist here; this service embeds with {name!r}")
    return runtime.embedding_model
