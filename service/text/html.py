"""An HTML document as verbatim markup around translatable text runs, and the way back.

``parse_html(document)`` gives ``markup`` (len(texts) + 1 chunks copied byte for byte from the
source) and ``texts`` (the runs to translate, character references decoded); ``render`` puts
translations back between the chunks.

Parser: the standard library's ``html.parser.HTMLParser``. It is a tokenizer that reports each
construct's source position and each start tag's exact source, so everything but the text runs
is copied untouched. lxml and selectolax (lexbor) build a tree and serialise it anew (attribute
quoting and case, entities, end tags the author omitted) and keep no source offsets (lxml: the
line only), so they cannot give a page back as it was written.

What is translated:

* Text between tags, minus leading and trailing whitespace (with ``&nbsp;``, ``&ensp;``,
  ``&emsp;``, ``&thinsp;``, ``&#32;``, ``&#160;``), which stays in the markup, as do
  whitespace-only runs: a translation needs no whitespace handling. ``<title>`` and
  ``<noscript>`` (a message to readers) are translated.
* The values of ``alt``, ``title``, ``placeholder`` and ``aria-label`` (what readers see or
  hear), as runs of kind ``ATTRIBUTE``.
* Not translated: ``<script>``, ``<style>`` (code); ``<iframe>``, ``<noembed>``,
  ``<noframes>``, ``<xmp>`` (raw text to newer parsers; fallbacks or legacy); ``<code>``,
  ``<kbd>``, ``<samp>``, ``<var>``, ``<pre>`` (code, input, output, layout that a sentence
  translator cannot keep), ``<math>``, ``<template>`` (inert, usually placeholders),
  ``<textarea>`` (a form field's value, submitted as is); any element with the HTML standard's
  ``translate="no"`` or the ``notranslate`` class (Google's, LibreTranslate's convention), with
  its descendants and their attributes. ``translate="yes"`` (or ``translate=""``) turns
  translation back on inside, and for ``<pre>``, ``<code>`` etc. themselves; never in raw text.

What ``render`` escapes: in text ``&``, ``<``, ``>`` and U+00A0 (as ``&amp;``, ``&lt;``,
``&gt;``, ``&nbsp;``); in a quoted attribute value ``&``, U+00A0 and its own quote (``&quot;``
or ``&#39;``); in a bare one those of text and both quotes, and it gets double quotes when the
translation needs them (empty, or with whitespace, ``=`` or a backtick). Every other character
is written as itself, so ``render(texts)`` gives the document back byte for byte but for the
runs' references: ``&eacute;`` or ``&#8212;`` come back as characters, a literal ``<``/``>``
in text as ``&lt;``/``&gt;``.

What is an error (``HtmlError``, with the line and column, both from 1): an end tag that closes
no open element (end tags of void elements such as ``</br>`` are accepted, and so is the end tag
of an element that a mis-nested end tag closed early: ``<b><i>x</b></i>``); a tag, end tag,
comment, CDATA section, declaration or processing instruction left open at the end of the
input; a ``<script>`` or ``<style>`` never closed (with newer Pythons' parser, which follows
HTML5 more closely, also ``<title>``, ``<textarea>``, ``<iframe>``...); markup the parser cannot
read as a tag (a NUL in a tag name with Python 3.11.7's parser).
Omitted optional end tags (``</p>``, ``</li>``, ``</td>``, ``</html>``...), void elements,
``<br/>``, unquoted or valueless attributes and a literal ``<`` before a non-letter are fine.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from html import escape, unescape
from html.entities import html5 as html5_entities
from html.parser import HTMLParser
from typing import NamedTuple


class HtmlError(ValueError):
    """The document cannot be translated faithfully (→ 422 in the API); the message names the
    problem and the line:column where it is."""

    def __init__(self, problem: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {problem}")
        self.problem = problem
        self.line = line
        self.column = column


class RunKind(StrEnum):
    TEXT = "text"  # character data between tags
    ATTRIBUTE = "attribute"  # the value of alt, title, placeholder or aria-label


@dataclass(frozen=True)
class HtmlDocument:
    markup: list[str]  # len(texts) + 1 verbatim chunks of the source
    texts: list[str]  # the translatable runs, character references decoded, in document order
    kinds: list[RunKind]  # one per text
    quotes: list[str]  # per run: the quote around an attribute value in the source, '' if bare or text

    def render(self, translations: Sequence[str]) -> str:
        """markup[0] + escape(translations[0]) + markup[1] + ... (one translation per text)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} text runs")
        parts = [self.markup[0]]
        for index, translation in enumerate(translations):
            parts.append(escape_run(translation, self.kinds[index], self.quotes[index]))
            parts.append(self.markup[index + 1])
        return "".join(parts)


def parse_html(document: str) -> HtmlDocument:
    """The document's markup and text runs; ``HtmlError`` when it cannot be kept faithfully."""
    runs = _Splitter(document).runs()
    markup, cut = [], 0
    for run in runs:
        markup.append(document[cut : run.start])
        cut = run.end
    markup.append(document[cut:])
    return HtmlDocument(
        markup=markup,
        texts=[run.text for run in runs],
        kinds=[run.kind for run in runs],
        quotes=[run.quote for run in runs],
    )


# The HTML standard's void elements (no content, no end tag), with the obsolete ones still parsed so.
_VOID = frozenset(
    {"area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input", "keygen"}
    | {"link", "meta", "param", "source", "track", "wbr"}
)
# Content the parser passes on raw (newer Pythons also do so for xmp, iframe, noembed, noframes).
_RAW_TEXT = frozenset({"script", "style", "xmp", "iframe", "noembed", "noframes", "plaintext"})
_UNTRANSLATED_CONTENT = frozenset({"code", "kbd", "samp", "var", "pre", "math", "template", "textarea"})
_TRANSLATED_ATTRIBUTES = frozenset({"alt", "title", "placeholder", "aria-label"})

_NEWLINE = re.compile("\n")  # HTMLParser counts lines by "\n" only
BLANK_REFERENCE = r"&(?:nbsp|ensp|emsp|thinsp);|&#0*(?:32|160);|&#[xX]0*(?:20|[aA]0);"
_LEADING_BLANK = re.compile(rf"(?:\s|{BLANK_REFERENCE})*")
_TRAILING_BLANK_REFERENCE = re.compile(rf"(?:{BLANK_REFERENCE})\Z")  # searched in the last 16 characters
_TAG_NAME = re.compile(r"<[^\t\n\r\f />]+")
# One attribute of a start tag as HTML tokenizes it: name, then an optional quoted or bare value.
_ATTRIBUTE = re.compile(
    r"""[\t\n\r\f /]*([^\t\n\r\f />][^\t\n\r\f /=>]*)"""
    r"""(?:[\t\n\r\f ]*=[\t\n\r\f ]*(?:"([^"]*)"|'([^']*)'|([^\t\n\r\f >]*)))?"""
)
_ATTRIBUTE_REFERENCE = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[a-zA-Z][a-zA-Z0-9]*;?)(=?)")
_UNQUOTED_UNSAFE = re.compile(r"[\s=`]")  # once escaped, the rest of what a bare value cannot hold
_QUOTE_REFERENCES = {'"': "&quot;", "'": "&#39;"}
# What the source left open at its end, by how it starts (first match).
_UNTERMINATED = {
    "<!--": "comment",
    "<![": "CDATA section",
    "<!": "declaration",
    "<?": "processing instruction",
    "</": "end tag",
    "<": "tag",
}


class _Run(NamedTuple):  # tuples, for one per text run and open element are cheap to create
    start: int
    end: int
    text: str
    kind: RunKind
    quote: str


class _Element(NamedTuple):
    tag: str
    text: bool  # its text is translated
    attributes: bool  # its descendants' attributes are translated: the HTML "translate" state
    line: int
    column: int


class _Splitter(HTMLParser):
    """Collects the text runs while keeping a stack of open elements for what is translated.

    Its own names have two underscores: HTMLParser keeps its state in one-underscore names
    (``_pending``, ``_open_elements``... in newer Pythons), which must not be overwritten.
    """

    def __init__(self, document: str) -> None:
        super().__init__(convert_charrefs=True)
        self.__document = document
        self.__line_starts = [0, *(m.end() for m in _NEWLINE.finditer(document))]
        self.__open = [_Element("", text=True, attributes=True, line=1, column=1)]
        self.__open_count: Counter[str] = Counter()
        self.__closed_early: Counter[str] = Counter()  # elements an outer end tag closed implicitly
        self.__pending = (-1, -1)  # the text span being gathered from consecutive data events
        self.__runs: list[_Run] = []

    def runs(self) -> list[_Run]:
        try:
            self.feed(self.__document)
            self.__refuse_unterminated()
            self.close()  # the text after the last tag
        except AssertionError as e:  # _markupbase's complaint about <![...
            raise self.__error(f"malformed markup ({e})") from e
        self.__flush_text()
        return self.__runs

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.__start(tag, attrs, closed=tag in _VOID)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.__start(tag, attrs, closed=True)

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self.__open_count[tag]:
            while (element := self.__open.pop()).tag != tag:
                self.__open_count[element.tag] -= 1
                self.__closed_early[element.tag] += 1
            self.__open_count[tag] -= 1
        elif self.__closed_early[tag]:
            self.__closed_early[tag] -= 1
        else:
            raise self.__error(f"end tag </{tag}> closes no open element")

    def handle_data(self, data: str) -> None:
        if not self.__open[-1].text:
            return
        start = self.__offset()
        lone_less_than = data == "<" and self.__document.startswith("<", start)
        end = start + 1 if lone_less_than else self.__text_end(start, data)
        if start == self.__pending[1]:
            self.__pending = (self.__pending[0], end)
        else:
            self.__flush_text()
            self.__pending = (start, end)

    def __start(self, tag: str, attrs: list[tuple[str, str | None]], closed: bool) -> None:
        parent = self.__open[-1]
        own = _translate_state(attrs) if attrs else None
        attributes = parent.attributes if own is None else own
        if tag in _RAW_TEXT:
            text = False
        elif own is not None:
            text = own
        else:
            text = parent.text and tag not in _UNTRANSLATED_CONTENT
        if attrs and attributes and any(name in _TRANSLATED_ATTRIBUTES for name, _ in attrs):
            self.__flush_text()  # runs stay in document order
            self.__attribute_runs(attrs)
        if not closed:
            line, column = self.getpos()
            self.__open.append(_Element(tag, text, attributes, line, column + 1))
            self.__open_count[tag] += 1

    def __attribute_runs(self, attrs: list[tuple[str, str | None]]) -> None:
        source = self.get_starttag_text() or ""
        found = list(_attributes(source))
        if [name for name, *_ in found] != [name for name, _ in attrs]:
            raise self.__error("cannot locate the attribute values of this tag")
        tag_start = self.__offset()
        for name, start, end in found:
            if name in _TRANSLATED_ATTRIBUTES and start >= 0:
                quote = source[start - 1] if source[start - 1] in "\"'" else ""
                self.__add_run(tag_start + start, tag_start + end, RunKind.ATTRIBUTE, quote)

    def __text_end(self, start: int, data: str) -> int:
        """Where the text the parser decoded to ``data`` ends in the source: at a '<' or the end."""
        end, size = start, len(self.__document)
        while True:
            found = self.__document.find("<", end + 1)
            end = size if found < 0 else found
            decoded = unescape(self.__document[start:end])
            if decoded == data:
                return end
            if end == size or len(decoded) >= len(data):
                raise self.__error("malformed markup the parser read as text")

    def __flush_text(self) -> None:
        start, end = self.__pending
        if start >= 0:
            self.__add_run(start, end, RunKind.TEXT, "")
        self.__pending = (-1, -1)

    def __add_run(self, start: int, end: int, kind: RunKind, quote: str) -> None:
        raw = self.__document[start:end]
        if raw.isspace():
            return
        # A bare attribute value keeps its edges: quotes added around a translation go right after '='.
        bare_value = kind is RunKind.ATTRIBUTE and not quote
        lead, trail = (0, len(raw)) if bare_value else _without_blank_edges(raw)
        if lead == trail:
            return
        core = raw[lead:trail]
        text = unescape(core) if kind is RunKind.TEXT else _decode_attribute(core)
        if not text.isspace():
            self.__runs.append(_Run(start + lead, start + trail, text, kind, quote))

    def __refuse_unterminated(self) -> None:
        """After feed() the parser holds back what it could not finish: at the end, that is an error."""
        if self.cdata_elem:
            element = self.__open[-1]
            raise HtmlError(f"<{element.tag}> is never closed", element.line, element.column)
        rest = self.rawdata
        if rest.startswith("<"):
            construct = next(name for prefix, name in _UNTERMINATED.items() if rest.startswith(prefix))
            raise self.__error(f"unterminated {construct} at the end of the input")

    def __offset(self) -> int:
        line, column = self.getpos()
        return self.__line_starts[line - 1] + column

    def __error(self, problem: str) -> HtmlError:
        line, column = self.getpos()
        return HtmlError(problem, line, column + 1)


def _without_blank_edges(raw: str) -> tuple[int, int]:
    """[start, end) of ``raw`` without its leading and trailing whitespace (references included)."""
    lead = _LEADING_BLANK.match(raw).end()  # type: ignore[union-attr]
    trail = len(raw)
    while trail > lead:
        if raw[trail - 1].isspace():
            trail -= 1
        elif reference := _TRAILING_BLANK_REFERENCE.search(raw, max(lead, trail - 16), trail):
            trail = reference.start()
        else:
            break
    return lead, trail


def _translate_state(attrs: list[tuple[str, str | None]]) -> bool | None:
    """The element's own translate state: yes, no, or None to inherit its parent's."""
    for name, value in attrs:
        if name == "class" and "notranslate" in (value or "").split():
            return False
    for name, value in attrs:
        if name == "translate":
            return {"": True, "yes": True, "no": False}.get((value or "").lower())
    return None


def _attributes(tag_source: str) -> Iterator[tuple[str, int, int]]:
    """(lowercase name, value start, value end) per attribute; start -1 when valueless."""
    match = _TAG_NAME.match(tag_source)
    position = match.end() if match else len(tag_source)
    while attribute := _ATTRIBUTE.match(tag_source, position):
        name = attribute[1].lower()
        group = next((g for g in (2, 3, 4) if attribute[g] is not None), 0)
        if group:
            yield name, attribute.start(group), attribute.end(group)
        else:
            yield name, -1, -1
        position = attribute.end()


def _decode_attribute(value: str) -> str:
    """Character references in an attribute value as the HTML standard decodes them: a named one
    without its ';' stays literal before '=' (query strings) or a letter or digit."""

    def decode(reference: re.Match[str]) -> str:
        name, equals = reference[1], reference[2]
        if name.startswith("#") or (name in html5_entities and (name.endswith(";") or not equals)):
            return unescape("&" + name) + equals
        return reference[0]

    return _ATTRIBUTE_REFERENCE.sub(decode, value)


def escape_run(text: str, kind: RunKind, quote: str) -> str:
    """``text`` as it is written in a run of ``kind`` (in an attribute value: within ``quote``)."""
    if quote:  # a quoted attribute value: '<' and '>' are plain characters there
        return text.replace("&", "&amp;").replace(quote, _QUOTE_REFERENCES[quote]).replace("\xa0", "&nbsp;")
    escaped = escape(text, quote=False).replace("\xa0", "&nbsp;")
    if kind is RunKind.TEXT:
        return escaped
    bare = escaped.replace('"', "&quot;").replace("'", "&#39;")
    return bare if bare and not _UNQUOTED_UNSAFE.search(bare) else f'"{bare}"'
