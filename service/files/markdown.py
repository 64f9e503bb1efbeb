"""Markdown whose structure survives translation.

markdown-it-py (CommonMark, with GFM tables) finds the blocks: only the inline content of
paragraphs, headings and table cells is translated; code blocks, fenced code, HTML blocks,
link reference definitions and every line outside those blocks are copied byte for byte. It
gives each block's lines and its inline content with the container prefixes (``>``, list
markers, indentation) removed, and each content line is found again in its source line, so
those prefixes stay as written. markdown-it-py was chosen over mistletoe and mdformat because it
reports source lines per block and does not re-render what it parsed.

Within the inline content these stay verbatim and split the text around them: inline code,
link and image destinations and titles (their text is translated), autolinks, bare URLs, inline
HTML tags, emphasis markers, backslash escapes and table pipes. So ``Run `make` now.`` is sent as
"Run" and "now." — never altering code or URLs weighs more than a sentence cut at its markup.
A paragraph's lines are translated together and written as one line where they were joined
(Markdown reads both the same); a line break kept in markup keeps its next line's prefix.
"""

from __future__ import annotations

import re
from typing import Any

from markdown_it import MarkdownIt

from service.files.pieces import Pieces, translatable

_PARSER = MarkdownIt("commonmark").enable("table")
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_VERBATIM_INLINE = re.compile(
    r"""(?P<code>`+)[\s\S]*?(?<!`)(?P=code)(?!`)      # inline code
    | <[A-Za-z][A-Za-z0-9+.\-]{1,31}:[^\s<>]*>          # autolink
    | <[^\s<>@]+@[^\s<>@]+>                             # e-mail autolink
    | </?[A-Za-z][^<>]*>                                # inline HTML tag
    | \]\((?:[^()\s]|\([^()\s]*\))*(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)   # ](destination "title")
    | \]\[[^\]]*\]                                      # ][reference]
    | !?\[ | \]                                         # link and image brackets
    | https?://[^\s<>()\[\]]+                           # bare URL
    | \\[!-/:-@\[-`{-~] | \\$                           # escape, hard line break
    | [*_~]+ | \|                                       # emphasis, table pipe
    """,
    re.VERBOSE | re.MULTILINE,
)


def markdown_pieces(text: str) -> Pieces:
    lines = _LINE.findall(text)
    regions = _inline_regions(lines)
    pieces = Pieces()
    number = 0
    while number < len(lines):
        region = regions.get(number)
        if region is None:
            pieces.add_markup(lines[number])
            number += 1
            continue
        end = _add_line_region(pieces, lines, number, region)
        number = end
    return pieces


def _inline_regions(lines: list[str]) -> dict[int, list[Any]]:
    """Each first line of a block with inline content → its inline tokens (a table row has one
    per cell, on the same line)."""
    regions: dict[int, list[Any]] = {}
    for token in _PARSER.parse("".join(lines)):
        if token.type == "inline" and token.map and token.content.strip():
            regions.setdefault(token.map[0], []).append(token)
    return regions


def _add_line_region(pieces: Pieces, lines: list[str], first: int, tokens: list[Any]) -> int:
    """Add the lines of ``tokens`` (inline content starting on line ``first``); returns the line
    after them. Content that cannot be found again in its source is left as it was."""
    end: int = max(token.map[1] for token in tokens)
    cursor = {number: 0 for number in range(first, end)}
    located: list[tuple[Any, list[tuple[int, int]]]] = []
    for token in tokens:
        spans = []
        for offset, content_line in enumerate(token.content.split("\n")):
            number = token.map[0] + offset
            at = lines[number].find(content_line, cursor.get(number, 0)) if number < end else -1
            if at < 0 or not content_line:
                break
            spans.append((number, at))
            cursor[number] = at + len(content_line)
        else:
            located.append((token, spans))
            continue
        for number in range(first, end):
            pieces.add_markup(lines[number])
        return end
    position = {number: 0 for number in range(first, end)}
    for token, spans in located:
        content_lines = token.content.split("\n")
        starts = [at for _, at in spans]
        numbers = [number for number, _ in spans]
        pieces.add_markup(lines[numbers[0]][position[numbers[0]] : starts[0]])
        _add_inline(pieces, token.content, lines, numbers, starts, content_lines)
        last = numbers[-1]
        position[last] = starts[-1] + len(content_lines[-1])
        for number in numbers[:-1]:
            position[number] = len(lines[number])
    for number in range(first, end):
        pieces.add_markup(lines[number][position[number] :])
    return end


def _add_inline(
    pieces: Pieces,
    content: str,
    lines: list[str],
    numbers: list[int],
    starts: list[int],
    content_lines: list[str],
) -> None:
    """The inline content: verbatim spans as markup, the text between them as texts; a line
    break inside a text joins the lines, one in markup gets its lines' suffix and prefix back."""
    line = 0

    def add_markup(markup: str) -> None:
        nonlocal line
        for part in re.split(r"(\n)", markup):
            if part != "\n":
                pieces.add_markup(part)
                continue
            number, following = numbers[line], numbers[line + 1]
            end_of_content = starts[line] + len(content_lines[line])
            pieces.add_markup(lines[number][end_of_content:])  # the line's rest, its newline included
            pieces.add_markup(lines[following][: starts[line + 1]])
            line += 1

    def add_text(text: str) -> None:
        nonlocal line
        stripped = text.strip()
        if not translatable(stripped):
            add_markup(text)
            return
        start = text.index(stripped)
        add_markup(text[:start])
        pieces.add_text(stripped)
        line += stripped.count("\n")
        add_markup(text[start + len(stripped) :])

    cut = 0
    for match in _VERBATIM_INLINE.finditer(content):
        add_text(content[cut : match.start()])
        add_markup(match.group())
        cut = match.end()
    add_text(content[cut:])
