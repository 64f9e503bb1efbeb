"""Export a translation checkpoint (ours or Marian) to verified ONNX artefacts, one per variant.

    export_translation(Path("export/checkpoints/transformer-en-de"), Path(".artefacts"),
                       ["fp32", "int8", "fp16"], eval_dir=Path("../shared/data/multi30k"))

writes ``<out_root>/<name>/<variant>/{encoder.onnx, decoder.onnx, tokenizer.json, manifest.json}``
in the layout of ``export.translation_graphs``. The stages: the source (``load_source``: ours in
``export.translation_graphs``, Marian in ``export.sources.marian``), its graphs
(export/graphs.py), verification through the service's engine (export/translation_verify.py)
and publishing (export/publish.py: staged, verified, then moved into place). A variant whose
manifest already names the same source weights (and tokenizer), reference sentences and the
current decoder layout, and still verifies, is skipped, so re-running the export is cheap.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from export.graphs import (
    TRANSLATION_GRAPHS,
    build_fp16,
    build_fp32,
    build_int8,
    decoder_layout,
    variant_layout,
)
from export.onnx_tools import file_entries, graph_spec
from export.publish import (
    Fusions,
    Parity,
    parse_variants,
    progress,
    publish_variants,
    published_manifest,
    still_to_export,
    tool_fields,
)
from export.reference import load_reference, reference_for
from export.shortlist import SHORTLIST_DECODER, shortlist_decoder
from export.sources import TranslationSource
from export.top_k_blocks import block_size, block_top_k, choose_block
from export.translation_graphs import decoder_io, load_ours
from export.translation_verify import TranslationVerifier
from service.artefacts import (
    Manifest,
    ReferenceCheck,
    SourceInfo,
    TranslationInfo,
    Variant,
    sha256_of,
    sha256_of_files,
)

TOKENIZER_FILE = "tokenizer.json"
VMAP_FILE = "vmap.txt"
# the slot layout's, with a shortlist and blocked candidates (fp16 keeps the GPU's layout)
SLOT_VARIANTS = ("fp32", "int8")


def load_source(path: Path, name: str | None = None) -> TranslationSource:
    """A Marian directory (config.json with model_type marian) or a checkpoint of ours; the
    artefact name defaults to the checkpoint's directory name."""
    from export.sources.marian import is_marian_dir, load_marian

    return load_marian(path, name) if is_marian_dir(path) else load_ours(path, name)


def write_tokenizer(source: TranslationSource, directory: Path) -> None:
    if source.tokenizer_file is not None:
        shutil.copyfile(source.tokenizer_file, directory / TOKENIZER_FILE)  # byte for byte
    else:
        source.tokenizer.save(str(directory / TOKENIZER_FILE))


def build_manifest(
    source: TranslationSource,
    variant: Variant,
    directory: Path,
    sha: str,
    parity_figures: Parity,
    fusions: Fusions,
    reference_check: ReferenceCheck | None = None,
) -> Manifest:
    shortlist = (directory / VMAP_FILE).is_file()
    graphs = {
        "encoder": graph_spec(directory, "encoder.onnx"),
        "decoder": graph_spec(directory, "decoder.onnx"),
    }
    if shortlist:
        graphs["decoder_shortlist"] = graph_spec(directory, SHORTLIST_DECODER)
    extra = [SHORTLIST_DECODER, VMAP_FILE] if shortlist else []
    return Manifest(
        name=source.name,
        task="translate",
        variant=variant,
        source=SourceInfo(kind=source.kind, path=str(source.path), sha256=sha),
        files=file_entries(directory, [*TRANSLATION_GRAPHS, TOKENIZER_FILE, *extra]),
        graphs=graphs,
        vocab_size=source.vocab_size,
        special_ids=source.special,
        translation=TranslationInfo(
            source_languages=source.source_languages,
            target_languages=source.target_languages,
            n_layers=source.n_layers,
            n_heads=source.n_heads,
            d_head=source.d_head,
            max_source_len=source.max_source_len,
            max_target_len=source.max_target_len,
            has_alignments=True,
            decoder_layout=decoder_layout(directory / "decoder.onnx"),
            length_penalty=source.length_penalty,
            vocabulary_map=VMAP_FILE if shortlist else None,
            top_k_block=block_size(directory / "decoder.onnx"),
        ),
        parity={k: round(float(v), 8) for k, v in parity_figures.items()},
        fusions=fusions,
        reference_check=reference_check,
        **tool_fields(directory / "decoder.onnx"),
    )


def up_to_date(
    directory: Path,
    source: TranslationSource,
    sha: str,
    variant: Variant,
    reference_sha: str,
    vmap: Path | None = None,
) -> bool:
    """A published artefact of the same weights and variant, measured on the current reference
    sentences (export/publish.py), with the same tokenizer file and vocabulary map (or none) and
    the current default decoder layout, its inputs and its candidates' selection (an older layout
    or a single TopK still loads, but the re-export is faster; a slot decoder from before its
    memory was held per sentence does not)."""
    manifest = published_manifest(
        directory,
        task="translate",
        name=source.name,
        variant=variant,
        source_sha256=sha,
        reference_sha256=reference_sha,
    )
    if manifest is None or manifest.translation is None:
        return False
    layout = variant_layout(variant)
    if manifest.translation.decoder_layout != layout:
        return False
    decoder_inputs = {t.name for t in manifest.graphs["decoder"].inputs}
    if decoder_inputs != set(decoder_io(layout, manifest.translation.n_layers)[0]):
        return False  # the layout's inputs have changed since (e.g. the slots' memory per sentence)
    if manifest.translation.length_penalty != source.length_penalty:  # a retuned default
        return False
    blocked = choose_block(source.vocab_size) if variant in SLOT_VARIANTS else None
    if manifest.translation.top_k_block != blocked:  # from before the blocked candidates
        return False
    listed = {f.path: f.sha256 for f in manifest.files}
    vmap_sha = sha256_of(vmap) if vmap is not None and variant in SLOT_VARIANTS else None
    if listed.get(VMAP_FILE) != vmap_sha:
        return False
    if source.tokenizer_file is not None:
        return listed.get(TOKENIZER_FILE) == sha256_of(source.tokenizer_file)
    return True


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
    ``<out_root>/<name>/<variant>/`` for each variant (``all``: every one, export/publish.py);
    returns those directories. ``name`` overrides the artefact name (default: the checkpoint
    directory's); ``reference`` is the sentence file every variant is measured on (default:
    the committed one in the source language, export/reference.py); ``vmap`` a vocabulary map
    (CTranslate2's format) that the CPU variants carry with their shortlist decoder
    (export/shortlist.py). Raises VerificationError
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
    variant built, given its manifest and verified by export/publish.py's one path."""

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
                shutil.copyfile(self.fp32_graphs / graph, staging / graph)
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
