"""Office, OpenDocument and EPUB files made by the tests (no binary fixtures): the few parts
each format needs to be recognised, with the paragraphs given, formatting runs included."""

from __future__ import annotations

import io
import zipfile
from xml.sax.saxutils import escape

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
P = "http://schemas.openxmlformats.org/presentationml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"

Runs = list[tuple[str, bool]]  # (text, bold) per run of a paragraph
_BOLD = "<w:rPr><w:b/></w:rPr>"


def archive(entries: list[tuple[str, bytes]], stored_first: bool = False) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for i, (name, data) in enumerate(entries):
            z.writestr(name, data, zipfile.ZIP_STORED if stored_first and i == 0 else zipfile.ZIP_DEFLATED)
    return out.getvalue()


def docx(paragraphs: list[Runs], document_xml: bytes | None = None) -> bytes:
    body = "".join(
        "<w:p><w:pPr><w:pStyle w:val='Normal'/></w:pPr>"
        + "".join(
            f"<w:r>{_BOLD if bold else ''}<w:t xml:space='preserve'>{escape(text)}</w:t></w:r>"
            for text, bold in runs
        )
        + "</w:p>"
        for runs in paragraphs
    )
    xml = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes'?>"
        f"<w:document xmlns:w='{W}'><w:body>{body}</w:body></w:document>"
    )
    return archive(
        [
            ("[Content_Types].xml", b"<?xml version='1.0'?><Types/>"),
            ("word/document.xml", document_xml if document_xml is not None else xml.encode()),
        ]
    )


def pptx(slides: list[list[Runs]]) -> bytes:
    entries = [
        ("[Content_Types].xml", b"<?xml version='1.0'?><Types/>"),
        ("ppt/presentation.xml", f"<p:presentation xmlns:p='{P}'/>".encode()),
    ]
    for n, paragraphs in enumerate(slides, start=1):
        body = "".join(
            "<a:p>"
            + "".join(f"<a:r><a:rPr b='{int(bold)}'/><a:t>{escape(t)}</a:t></a:r>" for t, bold in runs)
            + "</a:p>"
            for runs in paragraphs
        )
        xml = (
            f"<p:sld xmlns:p='{P}' xmlns:a='{A}'><p:cSld><p:spTree><p:sp><p:txBody>"
            f"{body}</p:txBody></p:sp></p:spTree></p:cSld></p:sld>"
        )
        entries.append((f"ppt/slides/slide{n}.xml", xml.encode()))
    return archive(entries)


def odf(paragraphs: list[Runs], presentation: bool = False) -> bytes:
    kind = "presentation" if presentation else "text"
    body = "".join(
        "<text:p text:style-name='P1'>"
        + "".join(
            f"<text:span text:style-name='Bold'>{escape(t)}</text:span>" if bold else escape(t)
            for t, bold in runs
        )
        + "</text:p>"
        for runs in paragraphs
    )
    content = (
        f"<?xml version='1.0' encoding='UTF-8'?><office:document-content xmlns:office='{OFFICE}' "
        f"xmlns:text='{TEXT}'><office:body><office:{kind}>{body}</office:{kind}></office:body>"
        "</office:document-content>"
    )
    return archive(
        [
            ("mimetype", f"application/vnd.oasis.opendocument.{kind}".encode()),
            ("content.xml", content.encode()),
        ],
        stored_first=True,
    )


def epub(chapters: list[str]) -> bytes:
    entries = [
        ("mimetype", b"application/epub+zip"),
        (
            "META-INF/container.xml",
            b"<?xml version='1.0'?><container xmlns='urn:oasis:names:tc:opendocument:xmlns:container' "
            b"version='1.0'><rootfiles><rootfile full-path='OEBPS/content.opf' "
            b"media-type='application/oebps-package+xml'/></rootfiles></container>",
        ),
        ("OEBPS/content.opf", b"<?xml version='1.0'?><package xmlns='http://www.idpf.org/2007/opf'/>"),
    ]
    for n, body in enumerate(chapters, start=1):
        xhtml = (
            "<?xml version='1.0' encoding='utf-8'?>\n<!DOCTYPE html>\n"
            f"<html xmlns='http://www.w3.org/1999/xhtml'><head><title>Chapter {n}</title></head>"
            f"<body>{body}</body></html>"
        )
        entries.append((f"OEBPS/chapter{n}.xhtml", xhtml.encode()))
    return archive(entries, stored_first=True)
