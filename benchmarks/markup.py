"""Stage ``markup``: inline HTML placed on the translation by the model's alignment.

The set: the terminology stage's sentences (``test_2016_flickr`` with a pair of the dictionary
learned on ``train``), each with its first dictionary term's first occurrence in ``<b>``. Each
default translator's int8 export in-process, beam 4, batches of 32 (sentence order), through
the serving layer's own segmentation, placement and reassembly (``service.serving.sentences``):
once as plain text, once as HTML. Figures: the share of HTML outputs whose text (tags taken
out) is the plain translation's, the share of ``<b>`` on the dictionary's target term among the
outputs whose plain translation holds it (the bold words, edge punctuation aside, are the term
and nothing else), and sentences/s of both (the cost of the alignment and the placement). The
quick run takes the first 96 sentences of each direction.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import Bench, Need, Stage
from benchmarks.results import Figure, Row
from benchmarks.terminology import BATCH, TermSentence, has_term, terminology_set

SECTION = "markup: {pair}, test_2016_flickr sentences with a dictionary term in <b>, beam 4, batches of 32"
PLAIN = "ours in-process (int8), plain text"
MARKED = "ours in-process (int8), the term in <b>"
_TAG = re.compile(r"<[^>]*>")
_BOLD = re.compile(r"<b>(.*?)</b>", re.DOTALL)
_EDGES = " \t\n.,;:!?\"'()"


@dataclass(frozen=True)
class Marked:
    html: str
    term: str  # the dictionary's target term for the word in <b>


def marked(sentence: TermSentence) -> Marked:
    """The sentence as HTML with its first term's first occurrence (as a word) in ``<b>``."""
    source, target = sentence.terms[0]
    escaped = html.escape(sentence.source, quote=False)
    bolded = re.sub(rf"(?<![^\W_]){re.escape(source)}(?![^\W_])", r"<b>\g<0></b>", escaped, count=1)
    return Marked(bolded, target)


def bold_on_term(output: str, term: str) -> bool:
    """One ``<b>`` in ``output``, around ``term`` alone (edge punctuation and spaces aside)."""
    bold = _BOLD.findall(output)
    return len(bold) == 1 and html.unescape(bold[0]).strip(_EDGES) == term


def passes(system: Any, texts: Sequence[str], fmt: str) -> tuple[float, list[str]]:
    """One timed pass: ``texts`` in batches of ``BATCH``, segmented, translated and put back
    together as the serving layer does."""
    from service.engine.base import TranslateOptions
    from service.serving.sentences import split

    outputs: list[str] = []
    start = time.perf_counter()
    for at in range(0, len(texts), BATCH):
        chunk = texts[at : at + BATCH]
        sentences = asyncio.run(split(chunk, fmt, "en", system.engine))  # type: ignore[arg-type]
        items, _ = sentences.items(TranslateOptions(beam_size=4))
        for result in sentences.assemble(system.dealt_out(items)):
            if isinstance(result, Exception):
                raise result
            outputs.append(result.hypotheses[0].text)
    return time.perf_counter() - start, outputs


def run(bench: Bench) -> None:
    from benchmarks.translators import OursInProcess
    from service.artefacts import read_manifest
    from service.settings import DEFAULT_TRANSLATE_MODELS

    for name in DEFAULT_TRANSLATE_MODELS:
        artefact = bench.models.get(f"{name}/int8")
        translation = None if artefact is None else read_manifest(artefact).translation
        if artefact is None or translation is None:
            bench.results.note(f"markup: {name} not measured (no int8 export)")
            continue
        pair = (translation.source_languages[0], translation.target_languages[0])
        _, sentences = terminology_set(bench.args.data_dir, *pair, limit=96 if bench.quick else None)
        systems = bench.system(OursInProcess, artefact, bench.threads, PLAIN)
        if not systems or not sentences:
            continue
        print(f"== markup: {name}, {len(sentences)} sentences", flush=True)
        first = name == DEFAULT_TRANSLATE_MODELS[0]  # the targets read the first direction's
        measure(bench, systems[0], sentences, SECTION.format(pair="→".join(pair)), first)


def measure(
    bench: Bench, system: Any, sentences: Sequence[TermSentence], section: str, figures: bool
) -> None:
    items = [marked(s) for s in sentences]
    plain_texts = [s.source for s in sentences]
    html_texts = [m.html for m in items]
    passes(system, plain_texts[:BATCH], "text")  # warm-up
    plain = min((passes(system, plain_texts, "text") for _ in range(bench.rounds)), key=lambda p: p[0])
    html_pass = min((passes(system, html_texts, "html") for _ in range(bench.rounds)), key=lambda p: p[0])
    identical = sum(
        html.unescape(_TAG.sub("", out)) == ref for out, ref in zip(html_pass[1], plain[1], strict=True)
    )
    holding = [i for i, m in enumerate(items) if has_term(plain[1][i], m.term)]
    on_term = sum(bold_on_term(html_pass[1][i], items[i].term) for i in holding)
    n = len(sentences)
    bench.results.add(
        Row(
            section,
            PLAIN,
            n / plain[0],
            "sent/s",
            baseline=True,
            figure=Figure.MARKUP_PLAIN if figures else None,
        )
    )
    extra = {
        "sentences": n,
        "identical_text_pct": round(100 * identical / n, 2),
        "holding_the_term": len(holding),
        "bold_on_term_pct": round(100 * on_term / len(holding), 2) if holding else float("nan"),
    }
    figure = Figure.MARKUP_HTML if figures else None
    bench.results.add(Row(section, MARKED, n / html_pass[0], "sent/s", extra=extra, figure=figure))


STAGE = Stage(
    "markup",
    "markup: inline HTML placed by the alignment",
    frozenset({Need.DEFAULT_TRANSLATORS}),
    run,
)
