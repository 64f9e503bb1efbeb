"""Hugging Face M2M100ForConditionalGeneration directories (M2M-100 and NLLB-200, one model for
many languages) as translation sources: ``source`` wraps the model into the translation ONNX
layout, forcing the target language's token first as transformers' ``forced_bos_token_id``."""

from __future__ import annotations


class M2M100ImportError(ValueError):
    """An M2M-100 / NLLB directory this importer cannot turn into a servable artefact; says why."""
