"""Stage ``base``: a base-sized Marian (random weights) in HF generate, CTranslate2 and our engine.

d_model 512, 6+6 layers, a 19k SentencePiece vocabulary; outputs forced to 20 tokens so that
every system does the same work. In-process only: the service has no option to suppress
``</s>``, and none is added for a benchmark. CTranslate2 int8 and ours int8 also run with the
same vocabulary map (export/graphs/vmap.py on Multi30k ``train``): CTranslate2's ``use_vmap`` over the
batch's union, ours over each sentence's shortlist (service/engine/translation/shortlist.py).
"""

from __future__ import annotations

import gc
from functools import partial

from benchmarks import translators as tr
from benchmarks.harness import Bench, Need, Stage
from benchmarks.results import Figure
from benchmarks.translation import BEAM4_BATCH32_FORCED, OURS_INT8, ct2_systems, run_suite
from benchmarks.translators import CT2_INT8, TextCodec, Translator, Workload

CT2_INT8_VMAP = "CTranslate2 int8 (vmap)"
CT2_INT8_REPLICAS_VMAP = "CTranslate2 int8 (replicas, vmap)"
OURS_INT8_SHORTLIST = "ours in-process (int8, shortlist)"


def run(bench: Bench) -> None:
    from transformers import MarianConfig

    from export.sources.marian.tokenizer import marian_tokenizer

    if bench.base is None:  # its preparation failed, with a note
        return
    paths = bench.base
    cfg = MarianConfig.from_pretrained(paths["hf"])
    codec = TextCodec(marian_tokenizer(paths["hf"]), eos_id=cfg.eos_token_id, pad_id=cfg.pad_token_id)
    systems: list[Translator] = [tr.HFGenerate(paths["hf"], codec, bench.threads)]
    systems += ct2_systems(paths, codec, bench.threads)
    vmap = paths["ct2-int8-vmap"]
    systems.append(tr.CTranslate2(vmap, codec, bench.threads, CT2_INT8_VMAP, use_vmap=True))
    systems.append(tr.CTranslate2(vmap, codec, bench.threads, CT2_INT8_REPLICAS_VMAP, True, use_vmap=True))
    for v in ("fp32", "int8"):
        if f"base/{v}" in bench.models:
            systems += bench.system(
                tr.OursInProcess, bench.models[f"base/{v}"], bench.threads, f"ours in-process ({v})"
            )
    if "base/int8" in bench.models:
        shortlisted = partial(tr.OursInProcess, shortlist=True)
        systems += bench.system(shortlisted, bench.models["base/int8"], bench.threads, OURS_INT8_SHORTLIST)
    n = 64 if bench.quick else 320
    src, _ = bench.test_set(n)
    workloads = [(BEAM4_BATCH32_FORCED, n), (Workload(1, 1, 20, True), 8 if bench.quick else 64)]
    print("== translation: random base-sized Marian", flush=True)
    run_suite(
        bench.results,
        f"random Marian base (d{cfg.d_model}, {cfg.encoder_layers}+{cfg.decoder_layers}, "
        f"vocab {cfg.vocab_size})",
        systems,
        src,
        None,
        codec,
        workloads,
        rounds=bench.rounds,
        figures={
            (BEAM4_BATCH32_FORCED, OURS_INT8): Figure.BASE_BEAM4_BATCH32_OURS_INT8,
            (BEAM4_BATCH32_FORCED, CT2_INT8): Figure.BASE_BEAM4_BATCH32_CT2_INT8,
        },
    )
    del systems
    gc.collect()


STAGE = Stage("base", "base Marian", frozenset({Need.BASE_MARIAN}), run)
