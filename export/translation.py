"""Export a translation checkpoint (ours or Marian) to verified ONNX artefacts, one per variant.

    export_translation(Path("export/checkpoints/transformer-en-de"), Path(".artefacts"),
                       ["fp32", "int8", "fp16"], eval_dir=Path("path/to/data/multi30k"))

writes ``<out_root>/<name>/<variant>/{encoder.onnx, decoder.onnx, tokenizer.json, manifest.json}``
(a graph over export/graphs/external_data.py's EXTERNAL_DATA_THRESHOLD with its weights beside it in
``<graph>.onnx.data``) in the layout of export/graphs/translation_layout.py. The stages: the
source (``load_source``: ours in export/sources/ours/source.py, Marian in
export/sources/marian/source.py), its graphs (export/graphs/translation.py), verification
through the service's engine (export/verify/translation.py) and publishing (export/publish/:
staged, verified, then moved into place, with the manifest of export/publish/translation.py). A
variant whose manifest already names the same source weights (and tokenizer), reference sentences
and the current decoder layout, and still verifies, is skipped, so re-running the export is cheap.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from export.graphs.external_data import copy_graph
from export.graphs.shortlist import SHORTLIST_DECODER, shortlist_decoder
from export.graphs.top_k_blocks import block_top_k
from export.graphs.translation import SLOT_VARIANTS, TRANSLATION_GRAPHS, build_fp16, build_fp32, build_int8
from export.progress import progress
from export.publish.translation import TOKENIZER_FILE, VMAP_FILE, build_manifest, up_to_date
from export.publish.variants import Fusions, parse_variants, publish_variants, still_to_export
from export.sources import TranslationSource
from export.sources.ours.source import load_ours
from export.verify import Parity
from export.verify.reference_set import load_reference, reference_for
from export.verify.translation import TranslationVerifier
from service.artefacts import Manifest, ReferenceCheck, Variant, sha256_of_files


def load_source(path: Path, name: str | None = None) -> TranslationSource:
    """A Marian or M2M-100/NLLB directory (config.json's model_type marian, m2m_100) or a
    checkpoint of ours; the artefact name defaults to the checkpoint's directory name."""
    from export.sources.m2m100.source import is_m2m100_dir, load_m2m100
    from export.sources.marian.source import is_marian_dir, load_marian

    if is_m2m100_dir(path):
        return load_m2m100(path, name)
    return load_marian(path, name) if is_marian_dir(path) else load_ours(path, name)


def write_tokenizer(source: TranslationSource, directory: Path) -> None:
    if source.tokenizer_file is not None:
        shutil.copyfile(source.tokenizer_file, directory / TOKENIZER_FILE)  # byte for byte
    else:
        source.tokenizer.save(str(directory / TOKENIZER_FILE))


def export_translation(
    source: Path,
    out_root: Path,
    variants: list[str],
    eval_dir: Path | None = None,
    name: str | None = None,
    reference: Path | None = None,
    vmap: Path | None = None,
) -> list[Path]:
    """Export ``source`` (a checkpoint of ours or a Marian directory) to
    ``<out_root>/<name>/<variant>/`` for each variant (``all``: every one, export/publish/variants.py);
    returns those directories. ``name`` overrides the artefact name (default: the checkpoint
    directory's); ``reference`` is the sentence file every variant is measured on (default:
    the committed one in the source language, export/verify/reference_set.py); ``vmap`` a vocabulary map
    (CTranslate2's format) that the CPU variants carry with their shortlist decoder
    (export/graphs/shortlist.py). Raises VerificationError
    when a variant is out of tolerance (nothing published for it, an earlier artefact kept),
    ValueError for what it cannot export.
    """
    wanted = parse_variants(variants)
    progress(f"loading {source}")
    src = load_source(source, name)
    sha = sha256_of_files(src.weight_files)
    root = out_root / src.name
    reference_set = load_reference(reference or reference_for(src.source_languages[0]))
    todo = still_to_export(
        wanted, root, lambda v: up_to_date(root / v, src, sha, v, reference_set.sha256, vmap)
    )
    if todo:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="translation-export-") as work:
            verifier = TranslationVerifier(src, eval_dir, reference_set, Path(work))
            _VariantExport(src, sha, verifier, vmap).run(todo, root)
    return [root / v for v in wanted]


class _VariantExport:
    """The variants of one source: fp32 graphs traced once (int8 is their rewrite), then each
    variant built, given its manifest and verified by export/publish/variants.py's one path."""

    def __init__(
        self, source: TranslationSource, sha: str, verifier: TranslationVerifier, vmap: Path | None
    ) -> None:
        self.source, self.sha, self.verifier, self.vmap = source, sha, verifier, vmap
        self.fp32_graphs = verifier.work / "fp32"
        self.fp32_graphs.mkdir()
        progress(f"{source.name}: tracing the fp32 encoder/decoder graphs")
        build_fp32(source, self.fp32_graphs)

    def run(self, todo: list[Variant], root: Path) -> None:
        """fp32 first, always verified (the baseline of the others), published only if asked for."""
        publish_variants(todo, root, self.build, self.manifest, self.verifier.verify)

    def build(self, variant: Variant, staging: Path) -> Fusions:
        if variant == "fp32":
            for graph in TRANSLATION_GRAPHS:
                copy_graph(self.fp32_graphs / graph, staging / graph)
            fusions: Fusions = {}  # the plain traced graphs
        elif variant == "int8":
            progress("  quantising to int8 (per-row activations)")
            fusions = build_int8(self.fp32_graphs, staging)
        else:
            progress("  tracing the fp16 graphs and optimising")
            fusions = build_fp16(self.source, staging)
        write_tokenizer(self.source, staging)
        if self.vmap is not None and variant in SLOT_VARIANTS:
            progress("  the decoder over vocabulary shortlists")
            shutil.copyfile(self.vmap, staging / VMAP_FILE)
            shortlist_decoder(staging / "decoder.onnx", staging / SHORTLIST_DECODER)
        if variant in SLOT_VARIANTS:  # after the shortlist, whose rewrite reads the single TopK
            block_top_k(staging / "decoder.onnx", self.source.vocab_size)
        return fusions

    def manifest(
        self, variant: Variant, staging: Path, fusions: Fusions, figures: Parity, check: ReferenceCheck | None
    ) -> Manifest:
        return build_manifest(self.source, variant, staging, self.sha, figures, fusions, check)
