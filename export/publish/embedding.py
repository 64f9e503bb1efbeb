"""When a published embedding variant is still up to date (its manifest: export/encoder_export.py)."""

from __future__ import annotations

from pathlib import Path

from export.publish.provenance import trained_on
from export.publish.variants import published_manifest, record_trained_on
from export.sources.bert import EmbeddingSource
from service.artefacts import Variant


def up_to_date(
    target: Path,
    source: EmbeddingSource,
    name: str,
    variant: Variant,
    sha: str,
    want_sts: bool,
    reference_sha: str,
) -> bool:
    """A published artefact of this very export (export/publish/variants.py), with the same embedding
    settings and, when an STS file was given, the STS figures measured. An up-to-date one gets the
    model card's ``trained_on`` recorded in its manifest (export/publish/variants.py: record_trained_on)."""
    manifest = published_manifest(
        target, task="embed", name=name, variant=variant, source_sha256=sha, reference_sha256=reference_sha
    )
    if (
        manifest is None
        or manifest.embedding != source.info()
        or (want_sts and "sts_spearman" not in manifest.parity)  # the asked-for check was not run
    ):
        return False
    record_trained_on(target, manifest, trained_on(source.directory))
    return True
