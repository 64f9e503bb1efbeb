"""What the embedding and the reranker export share (export/embedding.py, export/rerank.py): each
publishes one BERT-family encoder graph per variant beside the served tokenizer, the plain fp32
torch export made once and the other variants derived from it (export/graphs/embedding.py:
build_variant), through export/publish/variants.py's one path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from export.graphs.embedding import build_variant
from export.graphs.onnx_tools import file_entries, graph_spec
from export.publish.variants import Fusions, publish_variants, tool_fields
from export.sources.bert import TOKENIZER_FILE, EmbeddingSource
from export.verify import Parity
from export.verify.reference_set import ReferenceSet, load_reference
from service.artefacts import (
    EmbeddingInfo,
    Manifest,
    ReferenceCheck,
    RerankInfo,
    SourceInfo,
    SpecialIds,
    Variant,
    sha256_of_files,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class EncoderArtefact:
    """What every variant of a task's artefact holds but its graph, and how that graph starts:
    the plain fp32 export that ``export_fp32`` writes, each variant's ``graph_file`` derived from
    it. ``embedding``/``rerank`` and ``trained_on`` are the manifest's fields of the same names."""

    task: Literal["embed", "rerank"]
    encoder: EmbeddingSource
    tokenizer: Tokenizer
    special: SpecialIds
    graph: str  # the manifest's name for it: "encoder" (embed), "reranker" (rerank)
    graph_file: str
    export_fp32: Callable[[Path], None]
    embedding: EmbeddingInfo | None = None
    rerank: RerankInfo | None = None
    trained_on: str | None = None


@dataclass(frozen=True)
class EncoderExport:
    """One source's export: the artefact's name, its directory ``<out_root>/<name>``, the source
    weights' sha256 and the reference sentences every variant is measured on."""

    name: str
    root: Path
    sha: str
    reference_set: ReferenceSet

    @classmethod
    def start(
        cls, source_dir: Path, out_root: Path, name: str | None, weights: Iterable[Path], reference: Path
    ) -> EncoderExport:
        """``name`` defaults to the source directory's. Hugging Face's libraries are kept offline
        from here on: the export reads local directories only and never reaches a hub."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        name = name or Path(source_dir).resolve().name
        return cls(name, Path(out_root) / name, sha256_of_files(weights), load_reference(reference))

    def publish(
        self,
        todo: list[Variant],
        artefact: EncoderArtefact,
        verify: Callable[[Variant, Path], tuple[Parity, ReferenceCheck | None]],
    ) -> None:
        """Publish ``todo`` under the root (fp32 always verified, as the others' baseline)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="encoder-export-") as work_dir:
            work = Path(work_dir)
            plain = work / "plain.onnx"
            artefact.export_fp32(plain)

            def build(variant: Variant, staging: Path) -> Fusions:
                target = staging / artefact.graph_file
                fusions = build_variant(variant, artefact.encoder, plain, target, work)
                artefact.tokenizer.save(str(staging / TOKENIZER_FILE))
                return fusions

            publish_variants(todo, self.root, build, partial(self.manifest, artefact), verify)

    def manifest(
        self,
        artefact: EncoderArtefact,
        variant: Variant,
        staging: Path,
        fusions: Fusions,
        parity: Parity,
        check: ReferenceCheck | None,
    ) -> Manifest:
        return Manifest(
            name=self.name,
            task=artefact.task,
            variant=variant,
            source=SourceInfo(kind="bert", path=str(artefact.encoder.directory), sha256=self.sha),
            files=file_entries(staging),
            graphs={artefact.graph: graph_spec(staging, artefact.graph_file)},
            tokenizer=TOKENIZER_FILE,
            vocab_size=artefact.encoder.vocab_size,
            special_ids=artefact.special,
            embedding=artefact.embedding,
            rerank=artefact.rerank,
            parity=parity,
            fusions=fusions,
            reference_check=check,
            trained_on=artefact.trained_on,
            **tool_fields(staging / artefact.graph_file, variant),
        )
