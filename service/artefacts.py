"""The artefact directory and its manifest: the contract between export/ and service/.

An artefact directory holds ONNX graphs, ``tokenizer.json`` and ``manifest.json``. The export
step writes the manifest (export/ imports this module, never the other way round); the service
loads nothing whose sha256 does not match it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1

Task = Literal["translate", "embed", "rerank"]
Variant = Literal["fp32", "int8", "fp16"]
# The decoder layouts today's export writes (export/graphs/translation_layout.py) and the service
# serves, one decoder class each (service/engine/translation/layouts.py).
DecoderLayout = Literal["per_layer_kv_slots", "per_layer_kv_positions"]
# Layouts earlier exports wrote: their manifests still read, so that loading can name the layout and
# the command that exports the model again, instead of failing on the manifest.
RetiredDecoderLayout = Literal["stacked_kv", "stacked_kv_top_k", "per_layer_kv_top_k"]


# The translation graphs' tensor names: export/graphs/translation_layout.py names the inputs and
# outputs of encoder.onnx and decoder.onnx with these, service/engine/ feeds and reads them.
# Per-layer tensors carry the layer index: ``per_layer(PAST_KEYS, 0)`` is "past_keys_0".
INPUT_IDS = "input_ids"  # (B, S) source ids into the encoder; (N, 1) last tokens into the decoder
SOURCE_MASK = "source_mask"  # (N, S) 1 for real source tokens; slots: (sentences, S)
MEMORY_KEYS, MEMORY_VALUES = "memory_keys", "memory_values"  # cross-attention K/V of the source
# slots: the memory is held once per sentence and its rows (beams) are folded onto it
SENTENCE_ROWS = "sentence_rows"  # (sentences, width) each sentence's rows, padded by repeating one
BEAM_INDEX = "beam_index"  # (N,) row n's place in the folded (sentences · width) queries
PAST_KEYS, PAST_VALUES = "past_keys", "past_values"  # positions: the self-attention cache in
# positions: the graph reorders the cache and spreads the memory over the rows itself
BEAM_ROWS = "beam_rows"  # (N,) row n's row of the past_* cache (its beam's history)
MEMORY_ROWS = "memory_rows"  # (N,) row n's sentence in memory_* and source_mask (held per sentence)
PRESENT_KEYS, PRESENT_VALUES = "present_keys", "present_values"  # the cache out, one step longer
CACHE_KEYS, CACHE_VALUES = "cache_keys", "cache_values"  # slots: the cache, written in place
POSITIONS = "positions"  # (N,) tokens each row has decoded
TOP_K = "top_k"  # (1,) candidates wanted per row; 0: the full log-probs only
LOG_PROBS = "log_probs"  # (N, V)
TOP_LOG_PROBS, TOP_TOKENS = "top_log_probs", "top_tokens"  # (N, top_k), best first
CROSS_ATTENTION = "cross_attention"  # (N, S) the last layer's, averaged over heads
# decoder_shortlist.onnx (export/graphs/shortlist.py): the step over a vocabulary shortlist
VOCABULARY = "vocabulary"  # (V',) ascending target ids the running rows may produce
VOCABULARY_MASK = "vocabulary_mask"  # (N, V') bool: whether row n's sentence allows the token


def per_layer(name: str, layer: int) -> str:
    return f"{name}_{layer}"


def past_of(present: str) -> str:
    """The cache input a ``present_*`` output feeds at the next step: present_keys_3 → past_keys_3."""
    return "past_" + present.removeprefix("present_")


# The decoder input whose dtype is the cache's, per layout (positions, slots).
CACHE_DTYPE_INPUTS = (per_layer(PAST_KEYS, 0), per_layer(CACHE_KEYS, 0))


def decoder_layout_of(decoder_inputs: Iterable[str]) -> DecoderLayout | None:
    """The layout a decoder graph has, read from its input names (export/graphs/translation_layout.py);
    None for a graph of none the service serves."""
    names = set(decoder_inputs)
    if per_layer(CACHE_KEYS, 0) in names:
        if SENTENCE_ROWS not in names:
            raise ArtefactError(
                "a slot decoder without sentence_rows: exported before the memory was held once per "
                "sentence; export the model again"
            )
        return "per_layer_kv_slots"
    if POSITIONS in names and per_layer(PAST_KEYS, 0) in names and TOP_K in names:
        if BEAM_ROWS not in names:
            raise ArtefactError(
                "a positions decoder without beam_rows: exported before the decoder reordered its own "
                "cache; export the model again"
            )
        return "per_layer_kv_positions"
    return None


def served_decoder_layout(manifest: Manifest) -> bool:
    """Whether the service serves the artefact's decoder layout, inputs included (an embedding
    artefact's: True): False for a retired layout and for a served one's graph from before its
    inputs last changed, which ``make serve`` exports again."""
    if manifest.translation is None:
        return True
    layout = manifest.translation.decoder_layout
    if layout not in get_args(DecoderLayout) or "decoder" not in manifest.graphs:
        return False
    try:
        return decoder_layout_of(t.name for t in manifest.graphs["decoder"].inputs) == layout
    except ArtefactError:
        return False


# The embedding graph's I/O (encoder.onnx of an "embed" artefact): int64 [batch, sequence] in;
# token type ids only where EmbeddingInfo.needs_token_type_ids. Out: float32 [batch, dim], each
# row pooled (EmbeddingInfo.pooling) and the same L2-normalised: the service writes its answers
# from these arrays. Artefacts whose graph returned the hidden states are stale.
EMBEDDING_INPUT_IDS = INPUT_IDS
EMBEDDING_ATTENTION_MASK = "attention_mask"
EMBEDDING_TOKEN_TYPE_IDS = "token_type_ids"
EMBEDDING_OUTPUT = "sentence_embedding"
EMBEDDING_UNIT_OUTPUT = "unit_embedding"
EMBEDDING_OUTPUTS = (EMBEDDING_OUTPUT, EMBEDDING_UNIT_OUTPUT)
# The rerank graph (reranker.onnx of a "rerank" artefact): the embedding graph's inputs, a query and
# a document as one pair (token type ids 1 on the document where RerankInfo.needs_token_type_ids),
# the classifier's float32 [batch, 1] logits out; the manifest lists it as graphs[RERANK_GRAPH].
RERANK_GRAPH = "reranker"
RERANK_OUTPUT = "logits"


# The bits of an int8 artefact's weights: onnxruntime's u8×s8 kernels on CPUs without VNNI (AVX2's
# pmaddubsw) add two u8×s8 products into int16, which saturates for 8-bit weights and turns int8
# results to noise (docs/decisions.md); with |w| ≤ 63 the sum stays within int16 on every CPU.
INT8_WEIGHT_BITS = 7


class ArtefactError(RuntimeError):
    """An artefact directory that cannot be served; the message names the offending file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Strict):
    path: str  # relative to the artefact directory
    sha256: str
    size: int


class TensorSpec(_Strict):
    name: str
    dtype: str  # "int64", "float32", "float16"
    shape: list[int | str]  # str = dynamic axis name


class GraphSpec(_Strict):
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class SpecialIds(_Strict):
    pad: int
    bos: int | None = None  # decoder start token (translation)
    eos: int | None = None
    unk: int | None = None


class SourceInfo(_Strict):
    kind: Literal["ours", "marian", "m2m100", "bert"]
    path: str
    sha256: str  # of the source checkpoint's weight file(s), hashed in sorted name order


class TranslationInfo(_Strict):
    source_languages: list[str]
    target_languages: list[str]
    n_layers: int  # decoder layers
    n_heads: int
    d_head: int
    max_source_len: int
    max_target_len: int
    has_alignments: bool
    # The decoder graph's I/O (export/graphs/translation_layout.py); artefacts from before the field
    # have the plain stacked layout, which is no longer served.
    decoder_layout: DecoderLayout | RetiredDecoderLayout = "stacked_kv"
    # Requests that name none decode with it (score = log-prob / length ** penalty): the source's
    # generation_config.json, tuned on the model's validation set; 1.0 for artefacts without.
    length_penalty: float = 1.0
    # Multilingual models (M2M-100, NLLB): the token forced first when translating into each
    # language (its code as users send it); empty for models of one pair.
    language_tokens: dict[str, int] = {}
    # When a beam search stops (service/engine/translation/search.py, EarlyStopping), with Hugging Face's
    # meanings: what transformers' generate does for the model (its generation config); True (at
    # beam_size finished hypotheses) for our models and artefacts from before the field.
    early_stopping: bool | Literal["never"] = True
    # The vocabulary map (CTranslate2's vmap format) of an export with --vmap, whose manifest
    # then also lists the "decoder_shortlist" graph (export/graphs/shortlist.py); None: no shortlist.
    vocabulary_map: str | None = None
    # The decoder's candidates are picked by blocks of this many tokens (export/graphs/top_k_blocks.py;
    # the same output as one TopK); None: one TopK over the vocabulary (fp16, older artefacts).
    top_k_block: int | None = None


class EmbeddingInfo(_Strict):
    dim: int
    # lasttoken: the last real token's hidden state (decoder-style embedders; the batch is right-padded)
    pooling: Literal["mean", "cls", "lasttoken"]
    normalize: bool  # the source pipeline L2-normalises by default
    max_len: int
    needs_token_type_ids: bool
    # sentence-transformers' prompts (config_sentence_transformers.json): name -> the text put before
    # each input before tokenisation (E5/BGE-style "query: "); the default one applies to requests
    # that name none. Empty in artefacts of models without prompts, and in those written before.
    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None

    @model_validator(mode="after")
    def _default_prompt_is_a_prompt(self) -> EmbeddingInfo:
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not among the prompts")
        return self

    def prompt(self, name: str | None) -> str:
        """The text put before an input: the named prompt's, else the default prompt's, else none.
        Raises KeyError for a name the model has no prompt of."""
        if name is None:
            return "" if self.default_prompt_name is None else self.prompts[self.default_prompt_name]
        return self.prompts[name]


class RerankInfo(_Strict):
    """A cross-encoder (``…ForSequenceClassification`` with one label): its score of a pair is
    the logit, or the logit's sigmoid (TEI's and Cohere's relevance scores)."""

    max_len: int  # tokens of a query-document pair, special tokens included
    needs_token_type_ids: bool


class ReferenceCheck(_Strict):
    """A variant measured at export time on the committed reference sentences: alone vs batched,
    and (int8/fp16) against the fp32 artefact. ``bounds`` holds the limit each figure passed
    (``min_<figure>``); the export fails a variant beyond them."""

    reference: str  # the sentence file, relative to the repository
    sha256: str  # of that file
    sentences: int
    figures: dict[str, float]
    bounds: dict[str, float]
    # Translations: the rule capping each sentence's output (a random-weights model would
    # otherwise decode every sentence to max_target_len); absent before the cap existed.
    output_limit: str | None = None


class Manifest(_Strict):
    schema_version: int = SCHEMA_VERSION
    name: str  # e.g. "transformer-en-de", "all-MiniLM-L6-v2"
    task: Task
    variant: Variant
    source: SourceInfo
    files: list[FileEntry]
    graphs: dict[str, GraphSpec]  # translate: "encoder", "decoder"; embed: "encoder"; rerank: "reranker"
    tokenizer: str = "tokenizer.json"
    vocab_size: int
    special_ids: SpecialIds
    translation: TranslationInfo | None = None
    embedding: EmbeddingInfo | None = None
    rerank: RerankInfo | None = None
    opset: int
    ir_version: int
    onnxruntime_version: str  # the version that verified the parity figures below
    parity: dict[str, float] = Field(default_factory=dict)  # e.g. max_abs_logits, bleu, bleu_drop
    fusions: dict[str, int] = Field(default_factory=dict)  # onnxruntime optimizer fusion counts
    reference_check: ReferenceCheck | None = None  # absent in manifests written before it existed
    int8_weight_bits: int | None = None  # int8: INT8_WEIGHT_BITS; None: 8 bits (or not int8)
    # The domain and data the model was trained on, from its model card (export/publish/provenance.py),
    # reported by GET /v1/models; informational: None when the card does not say, or in manifests
    # written before the field, which stay current (the export fills it in without re-exporting).
    trained_on: str | None = None
    created_at: str

    @property
    def int8_weights_current(self) -> bool:
        """False for an int8 artefact of 8-bit weights (before ``INT8_WEIGHT_BITS``), which CPUs
        without VNNI compute wrongly: the export and the service's start export it again."""
        return self.variant != "int8" or self.int8_weight_bits == INT8_WEIGHT_BITS

    @property
    def embedding_graph_current(self) -> bool:
        """False for an embedding artefact whose graph returns hidden states (pooled by the
        service before the graph did it): the export and the service's start export it again."""
        if self.task != "embed":
            return True
        graph = self.graphs.get("encoder")
        return graph is not None and tuple(o.name for o in graph.outputs) == EMBEDDING_OUTPUTS


def sha256_of(path: Path) -> str:
    return sha256_of_files([path])


def sha256_of_files(paths: Iterable[Path]) -> str:
    """One sha256 over the files' bytes, concatenated in sorted path order (SourceInfo.sha256);
    of a single file, its plain sha256 (what sha256sum prints)."""
    h = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def file_entry(directory: Path, name: str) -> FileEntry:
    path = directory / name
    return FileEntry(path=name, sha256=sha256_of(path), size=path.stat().st_size)


def write_manifest(directory: Path, manifest: Manifest) -> None:
    tmp = directory / (MANIFEST_NAME + ".tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(directory / MANIFEST_NAME)


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ArtefactError(f"{path}: manifest missing (run the export step first)")
    try:
        return Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ArtefactError(f"{path}: invalid manifest: {e}") from e


def load_and_verify(directory: Path) -> Manifest:
    """Read the manifest and check every listed file's size and sha256; raise naming the file."""
    manifest = read_manifest(directory)
    for entry in manifest.files:
        path = directory / entry.path
        if not path.is_file():
            raise ArtefactError(f"{path}: listed in the manifest but missing")
        if path.stat().st_size != entry.size or sha256_of(path) != entry.sha256:
            raise ArtefactError(f"{path}: sha256 does not match the manifest (corrupted or replaced)")
    listed = {e.path for e in manifest.files}
    graphs = [g.file for g in manifest.graphs.values()]
    # a large graph's weights, in ONNX's external data file beside it (export/graphs/external_data.py)
    data_files = [f"{g}.data" for g in graphs if (directory / f"{g}.data").exists()]
    for needed in [manifest.tokenizer, *graphs, *data_files]:
        if needed not in listed:
            raise ArtefactError(f"{directory / needed}: used but not listed (unverifiable)")
    return manifest
