"""Export a BERT-family sentence-embedding model to verified ONNX artefacts (fp32, int8, fp16).

Each variant lands in ``<out_root>/<name>/<variant>/``: ``encoder.onnx`` (inputs and output
named in ``service.artefacts.EMBEDDING_*``: ids, mask [, token type ids] int64 [batch, seq] →
last hidden state float32 [batch, seq, dim]), ``tokenizer.json`` (truncation at ``max_len``,
padding off: the service pads its own batches) and ``manifest.json``.

The stages: the source (export/sources/bert.py: what the directory holds, read without torch),
its graph (export/graphs/embedding.py), verification through the service's loader and
``OnnxEmbedder`` against sentence-transformers and PyTorch (export/verify/embedding.py) and
publishing (export/publish/: staged, verified, then moved into place, with the manifest of
export/publish/embedding.py; an out-of-tolerance variant raises VerificationError and leaves an
earlier artefact untouched). Every variant also carries the
reference-set figures (alone vs batched, int8/fp16 vs fp32) in ``Manifest.reference_check``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from export.graphs.embedding import EMBEDDING_GRAPH, build_fp32, build_variant
from export.progress import progress
from export.publish.embedding import build_manifest, up_to_date
from export.publish.variants import Fusions, parse_variants, publish_variants, still_to_export
from export.sources.bert import TOKENIZER_FILE, EmbeddingSource, inspect_source, served_tokenizer, special_ids
from export.verify import Parity
from export.verify.embedding import DEFAULT_TOLERANCES, EmbeddingVerifier, Tolerances, read_sts
from export.verify.reference_set import REFERENCE_FILE, load_reference
from service.artefacts import Manifest, ReferenceCheck, SpecialIds, Variant, sha256_of_files

if TYPE_CHECKING:
    from tokenizers import Tokenizer


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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only: never reach a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    source_dir, out_root = Path(source_dir), Path(out_root)
    wanted = parse_variants(variants)
    source = inspect_source(source_dir)
    name = name or source_dir.resolve().name
    sha = sha256_of_files(source.weight_files)
    root = out_root / name
    reference_set = load_reference(reference)
    want_sts = sts_csv is not None
    todo = still_to_export(
        wanted, root, lambda v: up_to_date(root / v, source, name, v, sha, want_sts, reference_set.sha256)
    )
    if todo:
        root.mkdir(parents=True, exist_ok=True)
        tokenizer = served_tokenizer(source)
        special = special_ids(source, tokenizer)
        verifier = EmbeddingVerifier(
            source,
            tokenizer,
            special.pad,
            read_sts(sts_csv) if sts_csv else None,
            reference_set,
            tolerances,
            threads or torch.get_num_threads(),
            name,
        )
        with tempfile.TemporaryDirectory(prefix="embedding-export-") as work:
            _VariantExport(source, name, sha, tokenizer, special, verifier, Path(work)).run(todo, root)
    return [root / v for v in wanted]


class _VariantExport:
    """The variants of one source: the plain fp32 graph exported once (int8 and fp16 derive from
    it), then each variant built, given its manifest and verified by export/publish/variants.py's path."""

    def __init__(
        self,
        source: EmbeddingSource,
        name: str,
        sha: str,
        tokenizer: Tokenizer,
        special: SpecialIds,
        verifier: EmbeddingVerifier,
        work: Path,
    ) -> None:
        self.source, self.name, self.sha, self.work = source, name, sha, work
        self.tokenizer, self.special, self.verifier = tokenizer, special, verifier
        self.plain = work / "plain.onnx"
        progress(
            f"{name}: exporting {source.model_type} (dim {source.dim}, {source.pooling} pooling) to ONNX"
        )
        build_fp32(source, self.plain)

    def run(self, todo: list[Variant], root: Path) -> None:
        """fp32 first, always verified (the baseline of the others), published only if asked for."""
        publish_variants(todo, root, self.build, self.manifest, self.verifier.verify)

    def build(self, variant: Variant, staging: Path) -> Fusions:
        fusions = build_variant(variant, self.source, self.plain, staging / EMBEDDING_GRAPH, self.work)
        self.tokenizer.save(str(staging / TOKENIZER_FILE))
        return fusions

    def manifest(
        self, variant: Variant, staging: Path, fusions: Fusions, parity: Parity, check: ReferenceCheck | None
    ) -> Manifest:
        return build_manifest(
            self.source, self.name, variant, staging, self.sha, self.special, fusions, parity, check
        )
