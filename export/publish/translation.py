"""The translation artefact's manifest, and when a published variant is still up to date.

The manifest lists the graphs the variant carries (``encoder.onnx``, ``decoder.onnx`` and, with a
vocabulary map, ``decoder_shortlist.onnx`` beside ``vmap.txt``) with the external data files a
large graph reads (``decoder.onnx.data``…), the decoder's layout and
candidates' block as read back from the written decoder, and the figures of its verification.
"""

from __future__ import annotations

from pathlib import Path

from export.graphs.external_data import graph_files
from export.graphs.onnx_tools import file_entries, graph_spec
from export.graphs.shortlist import SHORTLIST_DECODER
from export.graphs.top_k_blocks import block_size, choose_block
from export.graphs.translation import SLOT_VARIANTS, TRANSLATION_GRAPHS, decoder_layout, variant_decoder
from export.publish.provenance import trained_on
from export.publish.variants import Fusions, published_manifest, record_trained_on, tool_fields
from export.sources import TranslationSource
from export.verify import Parity
from service.artefacts import (
    Manifest,
    ReferenceCheck,
    SourceInfo,
    TranslationInfo,
    Variant,
    sha256_of,
)

TOKENIZER_FILE = "tokenizer.json"
VMAP_FILE = "vmap.txt"


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
    listed = [*TRANSLATION_GRAPHS, *([SHORTLIST_DECODER] if shortlist else [])]
    files = [name for graph in listed for name in graph_files(directory, graph)]  # with their data
    files += [TOKENIZER_FILE, *([VMAP_FILE] if shortlist else [])]
    return Manifest(
        name=source.name,
        task="translate",
        variant=variant,
        source=SourceInfo(kind=source.kind, path=str(source.path), sha256=sha),
        files=file_entries(directory, files),
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
            language_tokens=source.language_tokens,
            early_stopping=source.early_stopping,
            vocabulary_map=VMAP_FILE if shortlist else None,
            top_k_block=block_size(directory / "decoder.onnx"),
        ),
        parity={k: round(float(v), 8) for k, v in parity_figures.items()},
        fusions=fusions,
        reference_check=reference_check,
        trained_on=trained_on(source.path),
        **tool_fields(directory / "decoder.onnx", variant),
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
    sentences (export/publish/variants.py), with the same tokenizer file and vocabulary map (or none) and
    the variant's decoder layout, its inputs and its candidates' selection (a single TopK still
    loads, but the re-export is faster; an earlier layout, or a slot decoder from before its
    memory was held per sentence, does not). An up-to-date one gets the model card's
    ``trained_on`` recorded in its manifest (export/publish/variants.py: record_trained_on)."""
    manifest = published_manifest(
        directory,
        task="translate",
        name=source.name,
        variant=variant,
        source_sha256=sha,
        reference_sha256=reference_sha,
    )
    if manifest is None or not _same_export(manifest, source, variant, vmap):
        return False
    record_trained_on(directory, manifest, trained_on(source.path))
    return True


def _same_export(manifest: Manifest, source: TranslationSource, variant: Variant, vmap: Path | None) -> bool:
    """Whether ``manifest``, of this source's weights, records today's graphs, tokenizer and
    vocabulary map."""
    if manifest.translation is None:
        return False
    decoder = variant_decoder(variant)
    if manifest.translation.decoder_layout != decoder.layout:
        return False
    decoder_inputs = {t.name for t in manifest.graphs["decoder"].inputs}
    if decoder_inputs != set(decoder.names(manifest.translation.n_layers)[0]):
        return False  # the layout's inputs have changed since (e.g. the slots' memory per sentence)
    if manifest.translation.length_penalty != source.length_penalty:  # a retuned default
        return False
    if manifest.translation.early_stopping != source.early_stopping:
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
