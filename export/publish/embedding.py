"""The embedding artefact's manifest, and when a published variant is still up to date."""

from __future__ import annotations

from pathlib import Path

from export.graphs.embedding import EMBEDDING_GRAPH
from export.graphs.onnx_tools import file_entries, graph_spec
from export.publish.provenance import trained_on
from export.publish.variants import Fusions, published_manifest, record_trained_on, tool_fields
from export.sources.bert import TOKENIZER_FILE, EmbeddingSource
from export.verify import Parity
from service.artefacts import Manifest, ReferenceCheck, SourceInfo, SpecialIds, Variant


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


def build_manifest(
    source: EmbeddingSource,
    name: str,
    variant: Variant,
    staging: Path,
    sha: str,
    special: SpecialIds,
    fusions: Fusions,
    parity: Parity,
    check: ReferenceCheck | None,
) -> Manifest:
    return Manifest(
        name=name,
        task="embed",
        variant=variant,
        source=SourceInfo(kind="bert", path=str(source.directory), sha256=sha),
        files=file_entries(staging),
        graphs={"encoder": graph_spec(staging, EMBEDDING_GRAPH)},
        tokenizer=TOKENIZER_FILE,
        vocab_size=source.vocab_size,
        special_ids=special,
        embedding=source.info(),
        parity=parity,
        fusions=fusions,
        reference_check=check,
        trained_on=trained_on(source.directory),
        **tool_fields(staging / EMBEDDING_GRAPH),
    )
