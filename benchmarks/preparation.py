"""The models every stage measures, built once and cached under ``<out>/cache``.

* our checkpoint as a ``MarianMTModel`` (checked: equal logits) and as CTranslate2 fp32/int8
  models, keyed by the checkpoint's sha256, and its fp32/int8 ONNX export;
* a random-weight base-sized Marian, its CTranslate2 conversions and its export;
* a random-weight model of NLLB-200-distilled-600M's shape, its CTranslate2 int8 conversion and
  its export (benchmarks/nllb.py);
* the fp32/int8 export of the embedding model;
* the fp32/int8 export of the default translation checkpoints (``make serve``'s models).

The exports are ``export_translation`` / ``export_embedding`` themselves, which skip a variant
that is up to date. A variant that fails to export is noted and not measured.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from benchmarks.common import read_lines
from benchmarks.harness import EMBED_NAME, Bench, Need
from benchmarks.nllb import NLLB_600M, NllbShape
from export.verify.reference_set import REFERENCE_FILE
from service.artefacts import sha256_of

# The base Marian's longest sequence. The benchmark decodes at most 20 tokens from test-set
# sentences; the export's checks decode a random-weight model to its maximum length (it never
# says </s>), which at Marian's usual 512 made preparation take the better part of an hour.
BASE_MAX_POSITIONS = 128
# Reference sentences the base Marian's export checks (alone vs batched, int8 vs fp32): enough to
# exercise mixed-length batches; random weights make any quality figure meaningless anyway.
BASE_REFERENCE_SENTENCES = 24


def prepare(bench: Bench, needs: frozenset[Need]) -> None:
    """What the selected stages need, once and in a fixed order: conversions and exports, then our
    service on the int8 artefacts (not with --no-http)."""
    if Need.OUR_CHECKPOINT in needs:
        bench.small = bench.guard("prepare our checkpoint", prepare_small, bench)
    if Need.BASE_MARIAN in needs:
        bench.base = bench.guard("prepare the base Marian", prepare_base, bench)
    if Need.NLLB in needs:
        bench.nllb = bench.guard("prepare the NLLB-shaped model", prepare_nllb, bench)
    if Need.EMBEDDING in needs:
        bench.guard("export the embedding model", export_embedding, bench)
    if Need.DEFAULT_TRANSLATORS in needs:
        bench.guard("export the default translators", export_default_translators, bench)
    if Need.SERVICE in needs and not bench.args.no_http:
        bench.service = bench.start_service()


def export_translation(
    bench: Bench, source: Path, key: str, reference: Path | None = None, vmap: Path | None = None
) -> None:
    """fp32 and int8 in one export (int8 reuses fp32's graphs and baselines, checked once); if
    that fails, each variant alone, so that one variant's failure is noted and the other measured."""
    from export.translation import export_translation

    variants = ["fp32", "int8"]
    try:
        paths = export_translation(source, bench.artefacts, variants, None, reference=reference, vmap=vmap)
    except Exception:  # retried variant by variant below, where each failure becomes a note
        traceback.print_exc()
    else:
        bench.models.update({f"{key}/{v}": path for v, path in zip(variants, paths, strict=True)})
        return
    for variant in variants:
        try:
            (path,) = export_translation(
                source, bench.artefacts, [variant], None, reference=reference, vmap=vmap
            )
            bench.models[f"{key}/{variant}"] = path
        except Exception as e:
            bench.results.note(
                f"export of {source.name} {variant} failed, ours-{variant} not measured: "
                f"{type(e).__name__}: {str(e)[:300]}"
            )


def export_embedding(bench: Bench) -> None:
    from export.embedding import export_embedding

    for variant in ("fp32", "int8"):
        try:
            paths = export_embedding(
                bench.embed_model_dir, bench.artefacts, [variant], name=EMBED_NAME, threads=bench.threads
            )
            bench.models[f"embed/{variant}"] = Path(paths[0])
        except Exception as e:
            bench.results.note(f"embedding export {variant} failed: {type(e).__name__}: {str(e)[:300]}")


def export_default_translators(bench: Bench) -> None:
    """Every default translation checkpoint (service/settings.py), as ``<name>/fp32|int8``; one
    that is missing is noted. The en→de one is ``--checkpoint``'s export when that is the default."""
    from export.__main__ import CHECKPOINTS_DIR
    from service.settings import DEFAULT_TRANSLATE_MODELS

    for name in DEFAULT_TRANSLATE_MODELS:
        checkpoint = CHECKPOINTS_DIR / name / "model.safetensors"
        if checkpoint.is_file():
            export_translation(bench, checkpoint, name)
        else:
            bench.results.note(f"default translator {name} not exported: no {checkpoint}")


def prepare_small(bench: Bench) -> dict[str, Path]:
    from benchmarks.marian_bridge import convert_checkpoint

    ckpt: Path = bench.args.checkpoint
    root = bench.cache / f"bridge-{ckpt.parent.name}-{sha256_of(ckpt)[:12]}"
    paths = {"hf": root / "hf", "ct2-float32": root / "ct2-float32", "ct2-int8": root / "ct2-int8"}
    if not all((p / ("model.bin" if "ct2" in k else "config.json")).is_file() for k, p in paths.items()):
        print(f"== converting {ckpt} to Marian / CTranslate2 → {root}", flush=True)
        paths = convert_checkpoint(ckpt, ckpt.parent / "tokenizer.json", root)
    verify_bridge(bench, ckpt, paths["hf"])
    export_translation(bench, ckpt, "small")
    return paths


def verify_bridge(bench: Bench, ckpt: Path, hf_dir: Path) -> None:
    """Equal logits, teacher-forced on test sentences: the HF model has our weights."""
    import torch
    from tokenizers import Tokenizer
    from transformers import MarianMTModel

    from benchmarks.marian_bridge import max_logit_difference
    from export.sources.ours.checkpoint import load_checkpoint
    from export.sources.ours.data import encode_source, encode_target, pad

    model = load_checkpoint(ckpt)
    marian = MarianMTModel.from_pretrained(hf_dir).eval()
    tok = Tokenizer.from_file(str(ckpt.parent / "tokenizer.json"))
    src_txt, tgt_txt = bench.test_set(8)
    src = pad(encode_source(tok, src_txt, model.cfg.max_len), model.cfg.pad_id)
    tgt = pad(encode_target(tok, tgt_txt, model.cfg.max_len), model.cfg.pad_id)[:, :-1]
    with torch.inference_mode():
        diff = max_logit_difference(model, marian, src, tgt)
    bench.results.series["bridge_max_abs_logit_difference"] = diff
    print(f"   bridge: max |Δlogit| ours vs MarianMTModel = {diff:.2e}", flush=True)
    if diff > 1e-3:
        raise RuntimeError(f"the Marian bridge is wrong: max |Δlogit| = {diff}")


def prepare_base(bench: Bench) -> dict[str, Path]:
    """The random base Marian, its CTranslate2 conversions (int8 also with the vocabulary map)
    and our export (with the same map for the shortlist rows)."""
    from benchmarks.marian_bridge import convert_marian_dir, make_random_marian

    hf = bench.cache / f"marian-base-random-en-de-{BASE_MAX_POSITIONS}pos"
    if not (hf / "config.json").is_file():
        print(f"== building the random base-sized Marian → {hf}", flush=True)
        corpus = read_lines(bench.multi30k / "train.en.gz") + read_lines(bench.multi30k / "train.de.gz")
        make_random_marian(hf, corpus, max_positions=BASE_MAX_POSITIONS)
    paths = {"hf": hf}
    for q in ("float32", "int8"):
        paths[f"ct2-{q}"] = convert_marian_dir(hf, bench.cache / f"{hf.name}-ct2-{q}", q)
    vmap = paths["vmap"] = base_vmap(bench, hf)
    paths["ct2-int8-vmap"] = convert_marian_dir(hf, bench.cache / f"{hf.name}-ct2-int8-vmap", "int8", vmap)
    export_translation(bench, hf, "base", reference_sentences(bench), vmap)
    return paths


def reference_sentences(bench: Bench) -> Path:
    """The first English sentences of the committed reference set, which a random-weight
    model's export checks (BASE_REFERENCE_SENTENCES of them)."""
    reference = bench.cache / f"reference-{BASE_REFERENCE_SENTENCES}.en.txt"
    lines = [s for s in REFERENCE_FILE.read_text(encoding="utf-8").splitlines() if s.strip()]
    reference.write_text("\n".join(lines[:BASE_REFERENCE_SENTENCES]) + "\n", encoding="utf-8")
    return reference


def prepare_nllb(bench: Bench, shape: NllbShape = NLLB_600M) -> dict[str, Path]:
    """The random model of ``shape`` (NLLB-200-distilled-600M's unless a test asks for a small
    one), its CTranslate2 int8 conversion and our export (fp32, the baseline int8 is verified
    against, and int8)."""
    from benchmarks.marian_bridge import convert_marian_dir
    from benchmarks.nllb import make_random_nllb

    hf = bench.cache / shape.name
    if not (hf / "config.json").is_file():
        print(f"== building the random NLLB-shaped model → {hf}", flush=True)
        corpus = read_lines(bench.multi30k / "train.en.gz") + read_lines(bench.multi30k / "train.de.gz")
        make_random_nllb(hf, corpus, shape)
    # CTranslate2's Transformers converter, as for the base Marian (it reads any model it supports)
    paths = {"hf": hf, "ct2-int8": convert_marian_dir(hf, bench.cache / f"{hf.name}-ct2-int8", "int8")}
    export_translation(bench, hf, "nllb", reference_sentences(bench))
    return paths


def base_vmap(bench: Bench, hf: Path) -> Path:
    """A vocabulary map for the base Marian from Multi30k ``train`` (export/graphs/vmap.py's defaults)."""
    from export.graphs.vmap import build_vmap
    from export.sources.marian.tokenizer import marian_tokenizer

    path = bench.cache / f"{hf.name}.vmap"
    if not path.is_file():
        en, de = (read_lines(bench.multi30k / f"train.{lang}.gz") for lang in ("en", "de"))
        lines = build_vmap(marian_tokenizer(hf), en, de, per_token=20, always=200)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
