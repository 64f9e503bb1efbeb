"""Verifying each staged translation variant through the service's engine (the export's third
stage; the checks themselves are in export/verify/translation_checks.py and export/verify/reference_set.py).

* fp32: memory K/V, log-probs and alignments within ``FP32_TOLERANCE`` of PyTorch on real
  sentences (decoded step by step with the cache) and random padded batches of mixed lengths;
  and the engine's greedy tokens equal PyTorch's on the built-in sentences and on the first
  validation sentences when ``eval_dir`` has them.
* int8 (per-row, export/graphs/int8_rowwise.py) / fp16: the same figures are recorded (not bounded),
  and when ``eval_dir`` has the test set, sacreBLEU with beam 4 may drop at most
  ``MAX_BLEU_DROP`` below the fp32 graph's.
* every variant: the reference sentences translated alone and in mixed-length batches give
  identical tokens at beam 1 and 4, and int8/fp16's beam-4 output keeps a chrF bound against
  fp32's; each sentence's output is capped as the service caps it (``OUTPUT_LIMIT_RULE``), so a
  model that never emits </s> (random weights) still verifies in bounded time.
* a variant with a vocabulary shortlist (``--vmap``): the same alone-vs-batched identity through
  the shortlist decoder; with every sentence allowed the whole vocabulary it must give the
  decoder's beam-4 output (at least ``MIN_WHOLE_VOCABULARY_AGREEMENT`` of the sentences: the
  two normalise in different precisions, so a near-tie may fall the other way); how many
  outputs the map itself leaves unchanged is recorded.

fp32 is verified first and is the baseline of the others (its BLEU and reference outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from export.graphs.translation import cpu_fp16_casts
from export.progress import progress
from export.sources import TranslationSource
from export.sources.ours.data import OUTPUT_LIMIT_RULE, output_limits
from export.verify import Parity, VerificationError
from export.verify.determinism import TranslationDeterminism, translation_determinism
from export.verify.reference_set import ReferenceSet, translation_check
from export.verify.translation_checks import (
    BUILTIN_SENTENCES,
    EVAL_BEAM,
    TEST_SPLIT,
    BleuResult,
    check_greedy,
    encode_sources,
    eval_bleu,
    greedy_agreement,
    open_engine,
    parity,
    validation_texts,
)
from service.artefacts import ReferenceCheck, Variant
from service.engine.base import TranslateItem, TranslateOptions, Translation
from service.engine.translation.shortlist import VocabularyMap
from service.engine.translation.translator import OnnxTranslator

FP32_TOLERANCE = 1e-4  # max |ONNX - PyTorch| on memory K/V, log-probs and alignments
MAX_BLEU_DROP = 0.5  # int8/fp16 vs fp32, sacreBLEU points on the test set
MIN_WHOLE_VOCABULARY_AGREEMENT = 0.98  # shortlist decoder over the whole vocabulary vs decoder


@dataclass(frozen=True)
class _Fp32Baseline:
    """What int8/fp16 are measured against."""

    bleu: BleuResult | None
    determinism: TranslationDeterminism


class TranslationVerifier:
    """One source's PyTorch references, computed once, and the fp32 baseline; ``verify`` checks
    one staged variant."""

    def __init__(
        self, source: TranslationSource, eval_dir: Path | None, reference_set: ReferenceSet, work: Path
    ) -> None:
        self.source, self.eval_dir, self.reference_set, self.work = source, eval_dir, reference_set, work
        self.val_texts = validation_texts(source, eval_dir)
        self.reference_limits = output_limits(
            encode_sources(source, reference_set.sentences), source.max_target_len
        )
        self._greedy: dict[str, list[list[int]]] = {}
        self._fp32: _Fp32Baseline | None = None
        self.check_tokenizer()  # once per source, before any variant is built

    def texts(self, which: str) -> list[str]:
        return BUILTIN_SENTENCES if which == "builtin" else self.val_texts

    def reference_greedy(self, which: str) -> list[list[int]]:
        """PyTorch's greedy output ids on the built-in ("builtin") or validation ("val") texts."""
        if which not in self._greedy:
            ids = encode_sources(self.source, self.texts(which))
            progress(f"  PyTorch greedy reference on {len(ids)} {which} sentences")
            self._greedy[which] = self.source.reference.greedy(
                ids, output_limits(ids, self.source.max_target_len)
            )
        return self._greedy[which]

    def verify(self, variant: Variant, directory: Path) -> tuple[Parity, ReferenceCheck | None]:
        """Load the staged directory as the service does and check it; (parity, reference check).
        Raises VerificationError when out of tolerance."""
        try:
            engine = open_engine(directory)
        except Exception as e:  # fp16 kernels the CPU provider lacks: nothing more to verify here
            if variant != "fp16":
                raise
            progress(f"  fp16 graphs do not run on the CPU provider ({e}); recorded as unverified")
            return {"cpu_verified": 0.0}, None
        progress(f"  {variant}: parity against PyTorch fp32")
        figures = parity(engine, self.source, self.reference_greedy("builtin")).as_parity()
        if variant == "fp16":  # verified on CPU, where part of the graph runs in float32
            figures |= {"cpu_verified": 1.0, "cpu_fp16_inserted_casts": cpu_fp16_casts(directory, self.work)}
        fp32_bleu = None
        if variant == "fp32":
            fp32_bleu = self._verify_fp32(engine, figures)
            if fp32_bleu is not None:
                figures |= {"bleu": fp32_bleu.bleu, "bleu_fp32": fp32_bleu.bleu, "bleu_drop": 0.0}
        else:
            figures |= self._verify_reduced(variant, engine)
        determinism = self._determinism(variant, engine)
        if engine.info.vocabulary_map is not None:
            figures |= self._verify_shortlist(variant, directory, determinism)
        if variant == "fp32":
            self._fp32 = _Fp32Baseline(fp32_bleu, determinism)
        baseline = None if variant == "fp32" else self._baseline().determinism
        check, failures = translation_check(
            self.reference_set, determinism, baseline, variant != "fp16", OUTPUT_LIMIT_RULE
        )
        progress(f"  {variant}: reference check {check.figures}")
        if failures:
            raise VerificationError(
                f"{self.source.name}/{variant} on the reference sentences: " + "; ".join(failures)
            )
        return figures, check

    def _baseline(self) -> _Fp32Baseline:
        if self._fp32 is None:
            raise RuntimeError("verify fp32 before the variants derived from it")
        return self._fp32

    def _determinism(self, variant: str, engine: OnnxTranslator) -> TranslationDeterminism:
        n = len(self.reference_set.sentences)
        progress(f"  {variant}: {n} reference sentences alone vs in mixed batches (beam 1 and 4)")
        return translation_determinism(
            engine, self.reference_set.sentences, max_lengths=self.reference_limits
        )

    def _verify_shortlist(self, variant: str, directory: Path, plain: TranslationDeterminism) -> Parity:
        """The shortlist decoder: batch-independent, equal to the decoder over the whole vocabulary;
        → its figures (``shortlist_*``)."""
        engine = open_engine(directory, shortlist=True)
        texts = self.reference_set.sentences
        found = self._determinism(f"{variant} with shortlists", engine)
        if not found.ok:
            raise VerificationError(f"{variant} with shortlists, alone vs batched: {found.describe(texts)}")
        engine.vocabulary_map = VocabularyMap.whole(engine.manifest.vocab_size)
        progress(f"  {variant}: the shortlist decoder over the whole vocabulary, beam 4")
        # one batched call: both decoders are batch-independent (checked above)
        items = [
            TranslateItem(t, TranslateOptions(beam_size=4, max_length=n))
            for t, n in zip(texts, self.reference_limits, strict=True)
        ]
        whole = [_best_tokens(result) for result in engine.translate(items)]
        agreement = _same_share(whole, plain.beams[4].alone)
        if agreement < MIN_WHOLE_VOCABULARY_AGREEMENT:
            raise VerificationError(
                f"{variant}: the shortlist decoder over the whole vocabulary gives the decoder's output for "
                f"{agreement:.1%} of the reference sentences (at least {MIN_WHOLE_VOCABULARY_AGREEMENT:.0%})"
            )
        figures = {f"shortlist_{k}": v for k, v in found.figures().items()}
        return figures | {
            "shortlist_whole_vocabulary_agreement_beam4": agreement,
            "shortlist_unchanged_output_beam4": _same_share(found.beams[4].alone, plain.beams[4].alone),
        }

    def _verify_fp32(self, engine: OnnxTranslator, figures: Parity) -> BleuResult | None:
        """Parity within tolerance and greedy tokens equal to PyTorch's (their counts are added to
        ``figures``); returns the BLEU when ``eval_dir`` has the test set."""
        worst = max(figures.values())
        if worst > FP32_TOLERANCE:
            raise VerificationError(
                f"fp32 graphs differ from PyTorch by {worst:.3g} > {FP32_TOLERANCE}: {figures}"
            )
        for which in ("builtin", "val"):
            texts = self.texts(which)
            if not texts:
                continue
            progress(f"  fp32: engine greedy vs PyTorch greedy on {len(texts)} {which} sentences")
            check = check_greedy(engine, self.source, texts, self.reference_greedy(which))
            if check.mismatches:
                raise VerificationError(
                    f"fp32 ONNX greedy differs from PyTorch on {which} sentences {check.mismatches[:10]}"
                )
            figures |= {
                f"greedy_{which}_sentences": check.sentences,
                f"greedy_{which}_near_ties": check.near_ties,
            }
        bleu = self._bleu("fp32", engine)
        if bleu is not None:
            progress(f"  fp32: BLEU {bleu.bleu:.2f}, {bleu.tokens_per_s:.0f} target tokens/s")
        return bleu

    def _bleu(self, variant: str, engine: OnnxTranslator) -> BleuResult | None:
        if self.eval_dir is None:
            return None
        progress(f"  sacreBLEU of {variant} on {TEST_SPLIT} (beam {EVAL_BEAM})")
        return eval_bleu(engine, self.source, self.eval_dir)

    def _verify_reduced(self, variant: str, engine: OnnxTranslator) -> Parity:
        out: Parity = {}
        for which in ("builtin", "val"):
            if self.texts(which):
                out[f"greedy_{which}_agreement"] = greedy_agreement(
                    engine, self.source, self.texts(which), self.reference_greedy(which)
                )
        base = self._baseline().bleu
        if base is None:
            return out
        bleu = self._bleu(variant, engine)
        if bleu is None:
            return out
        drop = base.bleu - bleu.bleu
        progress(
            f"  {variant}: BLEU {bleu.bleu:.2f} (fp32 {base.bleu:.2f}, drop {drop:.2f}), "
            f"{bleu.tokens_per_s:.0f} target tokens/s (fp32 {base.tokens_per_s:.0f})"
        )
        if drop > MAX_BLEU_DROP:
            raise VerificationError(f"{variant} loses {drop:.2f} BLEU against fp32 (limit {MAX_BLEU_DROP})")
        return out | {"bleu_fp32": base.bleu, "bleu": bleu.bleu, "bleu_drop": drop}

    def check_tokenizer(self) -> None:
        """A converted tokenizer must encode as the source framework's does."""
        if self.source.reference_encode is None:
            return
        want = self.source.reference_encode(BUILTIN_SENTENCES)
        got = [e.ids for e in self.source.tokenizer.encode_batch(BUILTIN_SENTENCES)]
        bad = [BUILTIN_SENTENCES[i] for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
        if bad:
            raise VerificationError(
                f"the converted tokenizer.json encodes differently from the source's: {bad[:3]}"
            )


def _same_share(a: list[list[str]], b: list[list[str]]) -> float:
    """The share of sentences whose outputs (token lists) are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def _best_tokens(result: Translation | Exception) -> list[str]:
    if isinstance(result, Exception):
        raise VerificationError(f"the shortlist decoder failed a reference sentence: {result}") from result
    return result.hypotheses[0].tokens
