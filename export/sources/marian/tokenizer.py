"""The tokenizer.json the service needs for a Marian directory: taken as is when the directory has
one, else converted from the MarianTokenizer's source SentencePiece model and ``vocab.json``
(there is no Marian converter in transformers' ``convert_slow_tokenizer``; its SpmConverter
normaliser is reused), so the service needs neither sentencepiece nor torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import Unigram
from tokenizers.processors import TemplateProcessing

from export.sources.marian import MarianImportError

_SPM_NORMAL, _SPM_USER_DEFINED = 1, 4
_SPM_UNIGRAM = 1
_UNSEEN_PIECE_SCORE = -1e9  # multi-character vocab.json pieces the source model never produces


def _spm_proto(path: Path) -> Any:
    try:
        from sentencepiece import sentencepiece_model_pb2  # needs protobuf (the export extra)
    except ImportError as e:
        raise MarianImportError(
            f"{path}: converting the MarianTokenizer needs sentencepiece and protobuf ({e}); "
            "install the export extra or provide a tokenizer.json"
        ) from e

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf
    proto.ParseFromString(path.read_bytes())
    return proto


def convert_marian_tokenizer(directory: Path, eos: str = "</s>", unk: str = "<unk>") -> Tokenizer:
    """A ``tokenizers`` Unigram over ``vocab.json``'s ids, scored by the source SentencePiece model,
    with its normaliser, Metaspace pre-tokenisation and ``$A </s>`` post-processing: encodes like
    MarianTokenizer (source side) and decodes target ids (shared vocabulary)."""
    spm_path, vocab_path = directory / "source.spm", directory / "vocab.json"
    if not (spm_path.is_file() and vocab_path.is_file()):
        raise MarianImportError(
            f"{directory}: no tokenizer.json and no MarianTokenizer files (source.spm + vocab.json) "
            "to convert; the service needs a tokenizers tokenizer.json"
        )
    if (directory / "target_vocab.json").is_file():
        raise MarianImportError(
            f"{directory}: separate source/target vocabularies (target_vocab.json) cannot be served "
            "with one tokenizer.json; only shared-vocabulary Marian models are supported"
        )
    proto = _spm_proto(spm_path)
    if proto.trainer_spec.model_type != _SPM_UNIGRAM:
        raise MarianImportError(f"{spm_path}: not a unigram SentencePiece model; cannot convert")
    vocab: dict[str, int] = json.loads(vocab_path.read_text(encoding="utf-8"))
    pieces = sorted(vocab, key=vocab.__getitem__)
    if [vocab[p] for p in pieces] != list(range(len(pieces))):
        raise MarianImportError(f"{vocab_path}: ids are not 0..{len(pieces) - 1}; cannot convert")
    tok = Tokenizer(Unigram(_unigram_scores(proto, pieces), unk_id=vocab[unk]))
    tok.normalizer = _spm_normalizer(proto)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = [
        p for p in pieces if p in (eos, unk, "<pad>", "<s>") or (p.startswith(">>") and p.endswith("<<"))
    ]
    tok.add_special_tokens([AddedToken(p, normalized=False, special=True) for p in specials])
    tok.post_processor = TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, vocab[eos])])
    return tok


def _unigram_scores(proto: Any, pieces: Sequence[str]) -> list[tuple[str, float]]:
    """Source-model scores for the shared vocabulary's pieces. A piece the source model lacks
    (target-only) must win only where SentencePiece would emit it too: a single character the
    model does not know comes out as itself at the unknown penalty (min score - 10, as
    SentencePiece), which MarianTokenizer then looks up in vocab.json; longer ones never."""
    scores = {p.piece: p.score for p in proto.pieces if p.type in (_SPM_NORMAL, _SPM_USER_DEFINED)}
    unknown_char = min(scores.values(), default=0.0) - 10.0
    return [(p, scores.get(p, unknown_char if len(p) == 1 else _UNSEEN_PIECE_SCORE)) for p in pieces]


def _spm_normalizer(proto: Any) -> normalizers.Normalizer:
    """SentencePiece's compiled normalisation rules, trailing-space strip and space collapsing
    (what transformers' SpmConverter does)."""
    steps: list[normalizers.Normalizer] = [
        normalizers.Strip(left=False, right=True),
        normalizers.Replace(Regex(" {2,}"), "▁"),
    ]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps.insert(0, normalizers.Precompiled(charsmap))
    return normalizers.Sequence(steps)


def marian_tokenizer(directory: Path) -> Tokenizer:
    """The directory's tokenizer.json if present (must append </s>), else a converted one."""
    path = directory / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.is_file() else convert_marian_tokenizer(directory)
