"""Export a BERT-family sentence-embedding model to verified ONNX artefacts (fp32, int8, fp16).

Each variant lands in ``<out_root>/<name>/<variant>/``: ``encoder.onnx`` (inputs and outputs
named in ``service.artefacts.EMBEDDING_*``: ids, mask [, token type ids] int64 [batch, seq] →
the pooled vectors and the same L2-normalised, float32 [batch, dim]), ``tokenizer.json``
(truncation at ``max_len``, padding off: the service pads its own batches) and ``manifest.json``.

The stages: the source (export/sources/bert.py: what the directory holds, read without torch),
its graph (export/graphs/embedding.py), verification through the service's loader and
``OnnxEmbedder`` against sentence-transformers and PyTorch (export/verify/embedding.py) and
publishing (export/encoder_export.py, as for rerankers, over export/publish/: staged, verified,
then moved into place; when a variant is up to date: export/publish/embedding.py; an out-of-tolerance
variant raises VerificationError and leaves an earlier artefact untouched). Every variant also
carries the reference-set figures (alone vs batched, int8/fp16 vs fp32) in ``Manifest.reference_check``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from export.encoder_export import EncoderArtefact, EncoderExport
from export.graphs.embedding import EMBEDDING_GRAPH, build_fp32
from export.progress import progress
from export.publish.embedding import up_to_date
from export.publish.provenance import trained_on
from export.publish.variants import parse_variants, still_to_export
from export.sources.bert import inspect_source, served_tokenizer, special_ids
from export.verify.embedding import DEFAULT_TOLERANCES, EmbeddingVerifier, Tolerances, read_sts
from export.verify.reference_set import REFERENCE_FILE


def export_embedding(
    source_dir: Path,
    out_root: Path,
    variants: list[str],
    sts_csv: Path | None = None,
    *,
    name: str | None = None,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
    threads: int | None = None,
    reference: Path = REFERENCE_FILE,
) -> list[Path]:
    """Export, verify and publish ``variants`` of an embedding model (``all``: every one,
    export/publish/variants.py); return the artefact directories.

    ``name`` defaults to the source directory's name; ``threads`` (default: torch's current
    setting) sizes the onnxruntime sessions used for verification; ``reference`` is the sentence
    file every variant is measured on (export/verify/reference_set.py). Variants already up to date (same
    source hash, intact files, same reference file) are skipped. Raises VerificationError when a
    variant is out of tolerance (nothing published for it), ValueError for a source it cannot
    export.
    """
    wanted = parse_variants(variants)
    source = inspect_source(Path(source_dir))
    run = EncoderExport.start(source_dir, out_root, name, source.weight_files, reference)
    want_sts = sts_csv is not None
    todo = still_to_export(
        wanted,
        run.root,
        lambda v: up_to_date(run.root / v, source, run.name, v, run.sha, want_sts, run.reference_set.sha256),
    )
    if todo:
        tokenizer = served_tokenizer(source)
        special = special_ids(source, tokenizer)
        verifier = EmbeddingVerifier(
            source,
            tokenizer,
            special.pad,
            read_sts(sts_csv) if sts_csv else None,
            run.reference_set,
            tolerances,
            threads or torch.get_num_threads(),
            run.name,
        )
        artefact = EncoderArtefact(
            task="embed",
            encoder=source,
            tokenizer=tokenizer,
            special=special,
            graph="encoder",
            graph_file=EMBEDDING_GRAPH,
            export_fp32=partial(build_fp32, source),
            embedding=source.info(),
            trained_on=trained_on(source.directory),
        )
        progress(
            f"{run.name}: exporting {source.model_type} (dim {source.dim}, {source.pooling} pooling) to ONNX"
        )
        run.publish(todo, artefact, verifier.verify)
    return [run.root / v for v in wanted]
