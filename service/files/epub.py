"""EPUB books: a ZIP archive (``safe_zip``) whose XHTML content documents are translated as HTML.

The archive must be an EPUB (its first entry ``mimetype`` says ``application/epub+zip``). Every
``.xhtml``, ``.html`` and ``.htm`` entry is checked by ``safe_xml`` (no entity declarations, no
external references, well-formed) and then translated as ``"format": "html"`` translates a page
(``service/files/html_pieces.py``): the markup byte for byte, the text runs and readable
attributes translated, inline formatting (``<em>``, links) placed by the alignment. The
package document, the table of contents and every other entry are copied as they are; the
archive keeps its order and each entry's compression (``mimetype`` first and stored).
"""

from __future__ import annotations

from service.files import safe_xml
from service.files.html_pieces import HtmlPieces
from service.files.pieces import Extracted, Ranges
from service.files.refusals import InvalidFile, UnsupportedFile
from service.files.safe_zip import Archive, ZipLimits
from service.text.html import HtmlError, parse_html

_CONTENT = (".xhtml", ".html", ".htm")


def read_epub(data: bytes, limits: ZipLimits, inline: bool) -> Extracted:
    archive = Archive(data, limits, "EPUB book")
    names = archive.names
    if not names or names[0] != "mimetype" or archive.read("mimetype").strip() != b"application/epub+zip":
        raise UnsupportedFile("the file is not an EPUB book: its archive does not start with its mimetype")
    documents: dict[str, HtmlPieces] = {}
    for name in names:
        if name.lower().endswith(_CONTENT):
            xhtml = archive.read(name)
            safe_xml.check(xhtml, name)
            try:
                documents[name] = HtmlPieces(parse_html(xhtml.decode("utf-8")), inline)
            except UnicodeDecodeError as e:
                raise InvalidFile(f"{name}: not UTF-8 at byte {e.start}") from e
            except HtmlError as e:
                raise InvalidFile(f"{name}: the XHTML cannot be kept: {e}") from e
    texts = [text for document in documents.values() for text in document.texts]
    elements = [found for document in documents.values() for found in document.elements]

    def rebuild(translations: list[str], ranges: list[Ranges]) -> bytes:
        replaced, start = {}, 0
        for name, document in documents.items():
            end = start + len(document.texts)
            replaced[name] = document.render(translations[start:end], ranges[start:end]).encode()
            start = end
        return archive.rebuild(replaced)

    return Extracted(texts, rebuild, elements)
