"""Export a BERT-family cross-encoder (reranker) to verified ONNX artefacts (fp32, int8, fp16).

Each variant lands in ``<out_root>/<name>/<variant>/``: ``reranker.onnx`` (ids, mask [, token
type ids] int64 [batch, seq] → logits float32 [batch, 1]; names in ``service.artefacts``),
``tokenizer.json`` (pairs truncated longest-first at ``max_len``, padding off) and
``manifest.json`` (task ``rerank``).

The stages, as for embeddings (export/embedding.py): the source (export/sources/cross_encoder.py),
its graph (built here: the plain torch export for fp32, its per-row int8 rewrite, the fused fp16),
verification through the service's loader and ``OnnxReranker`` against Hugging Face's
``AutoModelForSequenceClassification`` (export/verify/rerank.py) and publishing
(export/encoder_export.py, as for embeddings, over export/publish/variants.py: staged, verified,
then moved into place; an out-of-tolerance variant raises VerificationError and leaves an
earlier artefact untouched).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from export.encoder_export import EncoderArtefact, EncoderExport
from export.graphs.onnx_tools import OPSET, export_onnx
from export.progress import progress
from export.publish.variants import parse_variants, published_manifest, still_to_export
from export.sources.bert import special_ids
from export.sources.cross_encoder import (
    CrossEncoderSource,
    inspect_cross_encoder,
    logits_module,
    pair_tokenizer,
)
from export.verify.reference_set import REFERENCE_FILE
from export.verify.rerank import DEFAULT_TOLERANCES, RerankVerifier, Tolerances
from service.artefacts import RERANK_GRAPH, RERANK_OUTPUT, Variant

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
    wanted = parse_variants(variants)
    source = inspect_cross_encoder(Path(source_dir))
    run = EncoderExport.start(source_dir, out_root, name, source.encoder.weight_files, reference)

    def up_to_date(variant: Variant) -> bool:
        manifest = published_manifest(
            run.root / variant,
            task="rerank",
            name=run.name,
            variant=variant,
            source_sha256=run.sha,
            reference_sha256=run.reference_set.sha256,
        )
        return manifest is not None and manifest.rerank == source.info()

    todo = still_to_export(wanted, run.root, up_to_date)
    if todo:
        verifier = RerankVerifier(
            source, run.reference_set, tolerances, threads or torch.get_num_threads(), run.name
        )
        tokenizer = pair_tokenizer(source)
        artefact = EncoderArtefact(
            task="rerank",
            encoder=source.encoder,
            tokenizer=tokenizer,
            special=special_ids(source.encoder, tokenizer),
            graph=RERANK_GRAPH,
            graph_file=RERANK_GRAPH_FILE,
            export_fp32=partial(build_fp32, source),
            rerank=source.info(),
        )
        progress(f"{run.name}: exporting {source.architecture} (max length {source.encoder.max_len}) to ONNX")
        run.publish(todo, artefact, verifier.verify)
    return [run.root / v for v in wanted]


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
