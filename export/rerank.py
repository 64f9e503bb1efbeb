"""Export a BERT-family cross-encoder (reranker) to verified ONNX artefacts (fp32, int8, fp16).

Each variant lands in ``<out_root>/<name>/<variant>/``: ``reranker.onnx`` (ids, mask [, token
type ids] int64 [batch, seq] → logits float32 [batch, 1]; names in ``service.artefacts``),
``tokenizer.json`` (pairs truncated longest-first at ``max_len``, padding off) and
``manifest.json`` (task ``rerank``).

The stages, as for embeddings (export/embedding.py): the source (export/sources/cross_encoder.py),
its graph (built here: the plain torch export for fp32, its per-row int8 rewrite, the fused fp16),
verification through the service's loader and ``OnnxReranker`` against Hugging Face's
``AutoModelForSequenceClassification`` (export/verify/rerank.py) and publishing
(export/publish/variants.py: staged, verified, then moved into place; an out-of-tolerance
variant raises VerificationError and leaves an earlier artefact untouched).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from export.graphs.embedding import build_variant
from export.graphs.onnx_tools import OPSET, export_onnx, file_entries, graph_spec
from export.progress import progress
from export.publish.variants import (
    Fusions,
    parse_variants,
    publish_variants,
    published_manifest,
    still_to_export,
    tool_fields,
)
from export.sources.bert import TOKENIZER_FILE, special_ids
from export.sources.cross_encoder import (
    CrossEncoderSource,
    inspect_cross_encoder,
    logits_module,
    pair_tokenizer,
)
from export.verify import Parity
from export.verify.reference_set import REFERENCE_FILE, load_reference
from export.verify.rerank import DEFAULT_TOLERANCES, RerankVerifier, Tolerances
from service.artefacts import (
    RERANK_GRAPH,
    RERANK_OUTPUT,
    Manifest,
    ReferenceCheck,
    SourceInfo,
    Variant,
    sha256_of_files,
)

RERANK_GRAPH_FILE = "reranker.onnx"


def export_rerank(
    source_dir: Path,
    out_root: Path,
    variants: list[str],
    *,
    name: str | None = None,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
    threads: int | None = None,
    reference: Path = REFERENCE_FILE,
) -> list[Path]:
    """Export, verify and publish ``variants`` of a cross-encoder (``all``: every one); return
    the artefact directories. As ``export.embedding.export_embedding``: ``name`` defaults to the
    source directory's name, variants already up to date are skipped, VerificationError for a
    variant out of tolerance, ValueError for a source it cannot export."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only: never reach a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    source_dir, out_root = Path(source_dir), Path(out_root)
    wanted = parse_variants(variants)
    source = inspect_cross_encoder(source_dir)
    name = name or source_dir.resolve().name
    sha = sha256_of_files(source.encoder.weight_files)
    root = out_root / name
    reference_set = load_reference(reference)

    def up_to_date(variant: Variant) -> bool:
        manifest = published_manifest(
            root / variant,
            task="rerank",
            name=name,
            variant=variant,
            source_sha256=sha,
            reference_sha256=reference_set.sha256,
        )
        return manifest is not None and manifest.rerank == source.info()

    todo = still_to_export(wanted, root, up_to_date)
    if todo:
        root.mkdir(parents=True, exist_ok=True)
        verifier = RerankVerifier(source, reference_set, tolerances, threads or torch.get_num_threads(), name)
        with tempfile.TemporaryDirectory(prefix="rerank-export-") as work:
            _VariantExport(source, name, sha, verifier, Path(work)).run(todo, root)
    return [root / v for v in wanted]


def build_fp32(source: CrossEncoderSource, path: Path) -> None:
    """The plain torch export of the source's logits (no fusion: faster on CPU, as embeddings)."""
    names = source.input_names
    # a padded pair example, so that the traced mask and token type paths are the general ones
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    example = (ids, mask, types)[: len(names)]
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {RERANK_OUTPUT: {0: "batch"}}
    export_onnx(
        logits_module(source),
        example,
        path,
        input_names=names,
        output_names=[RERANK_OUTPUT],
        dynamic_axes=axes,
        opset=OPSET,
    )


class _VariantExport:
    """The variants of one source: the plain fp32 graph exported once (int8 and fp16 derive from
    it), then each variant built, given its manifest and verified by export/publish/variants.py."""

    def __init__(self, source: CrossEncoderSource, name: str, sha: str, verifier: RerankVerifier, work: Path):
        self.source, self.name, self.sha, self.verifier, self.work = source, name, sha, verifier, work
        self.tokenizer = pair_tokenizer(source)
        self.special = special_ids(source.encoder, self.tokenizer)
        self.plain = work / "plain.onnx"
        progress(f"{name}: exporting {source.architecture} (max length {source.encoder.max_len}) to ONNX")
        build_fp32(source, self.plain)

    def run(self, todo: list[Variant], root: Path) -> None:
        publish_variants(todo, root, self.build, self.manifest, self.verifier.verify)

    def build(self, variant: Variant, staging: Path) -> Fusions:
        target = staging / RERANK_GRAPH_FILE
        fusions = build_variant(variant, self.source.encoder, self.plain, target, self.work)
        self.tokenizer.save(str(staging / TOKENIZER_FILE))
        return fusions

    def manifest(
        self, variant: Variant, staging: Path, fusions: Fusions, parity: Parity, check: ReferenceCheck | None
    ) -> Manifest:
        return Manifest(
            name=self.name,
            task="rerank",
            variant=variant,
            source=SourceInfo(kind="bert", path=str(self.source.directory), sha256=self.sha),
            files=file_entries(staging),
            graphs={RERANK_GRAPH: graph_spec(staging, RERANK_GRAPH_FILE)},
            tokenizer=TOKENIZER_FILE,
            vocab_size=self.source.encoder.vocab_size,
            special_ids=self.special,
            rerank=self.source.info(),
            parity=parity,
            fusions=fusions,
            reference_check=check,
            **tool_fields(staging / RERANK_GRAPH_FILE),
        )
