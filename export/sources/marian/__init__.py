"""Hugging Face MarianMTModel directories (opus-mt) as translation sources: ``source`` wraps the
model into the translation ONNX layout, ``tokenizer`` gives the service its tokenizer.json."""

from __future__ import annotations


class MarianImportError(ValueError):
    """A Marian directory this importer cannot turn into a servable artefact; says why."""
