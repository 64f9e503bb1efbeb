"""A glossary's entries: source term → target term, how the source term is matched, and the
checks every entry passes before a glossary is kept (``GlossaryProblem`` names the entry).

DeepL's entries (TSV or CSV, ``parse_entries``) are matched case-sensitively and as whole
words, as DeepL's own are; ``/v1/glossaries`` entries default to the same and may say otherwise.
"""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

EntriesFormat = Literal["tsv", "csv"]


@dataclass(frozen=True)
class Entry:
    source: str
    target: str
    case_sensitive: bool = True
    whole_word: bool = True  # the term is not part of a longer word (\w on neither side)


class GlossaryProblem(ValueError):
    """An entry or a glossary that cannot be kept; ``where`` names the entry (its index, from
    0, or its line in a TSV/CSV text, from 1) and ``limit`` the limit it passed, if any."""

    def __init__(self, message: str, where: str = "entries", limit: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.limit = limit


def checked_entries(entries: Sequence[Entry], max_entries: int, max_term_chars: int) -> tuple[Entry, ...]:
    """``entries`` with surrounding whitespace stripped from each term, or the first problem: no
    entries, more than ``max_entries``, an empty term, one longer than ``max_term_chars``, a
    control character (tab, line break), or a source term given twice."""
    if not entries:
        raise GlossaryProblem("a glossary needs at least one entry")
    if len(entries) > max_entries:
        raise GlossaryProblem(
            f"{len(entries)} entries, more than the {max_entries} a glossary may hold", limit=max_entries
        )
    out: list[Entry] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"entries[{i}]"
        source, target = entry.source.strip(), entry.target.strip()
        for side, term in (("source", source), ("target", target)):
            _check_term(term, f"{where}.{side}", max_term_chars)
        key = source if entry.case_sensitive else source.casefold()
        if key in seen:
            raise GlossaryProblem(f"the source term {source!r} is given more than once", where)
        seen.add(key)
        out.append(Entry(source, target, entry.case_sensitive, entry.whole_word))
    return tuple(out)


def _check_term(term: str, where: str, max_chars: int) -> None:
    if not term:
        raise GlossaryProblem("a term must not be empty", where)
    if len(term) > max_chars:
        raise GlossaryProblem(
            f"a term of {len(term)} characters, longer than {max_chars}", where, limit=max_chars
        )
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in term):
        raise GlossaryProblem("a term must not hold tabs, line breaks or control characters", where)


def parse_entries(text: str, entries_format: EntriesFormat) -> list[Entry]:
    """DeepL's entries: one ``source<TAB>target`` (TSV) or ``source,target`` (CSV, quoted as
    RFC 4180 says; DeepL's optional third and fourth columns, the languages, are accepted when
    present) per line; blank lines are skipped. A line without exactly two terms is a problem
    naming its line."""
    rows: Iterable[list[str]]
    if entries_format == "tsv":
        rows = (line.split("\t") for line in text.splitlines())
    else:
        rows = csv.reader(io.StringIO(text, newline=""), strict=True)
    entries = []
    try:
        for line, row in enumerate(rows, start=1):
            if not any(cell.strip() for cell in row):
                continue
            if len(row) not in (2, 4) or (len(row) == 4 and entries_format == "tsv"):
                separator = "a tab" if entries_format == "tsv" else "a comma"
                raise GlossaryProblem(
                    f"line {line}: expected a source and a target term separated by {separator}",
                    f"entries line {line}",
                )
            entries.append(Entry(row[0], row[1]))
    except csv.Error as e:
        raise GlossaryProblem(f"malformed CSV: {e}") from e
    return entries


def as_tsv(entries: Iterable[Entry]) -> str:
    """DeepL's ``/entries`` answer: one ``source<TAB>target`` per line."""
    return "\n".join(f"{e.source}\t{e.target}" for e in entries)
