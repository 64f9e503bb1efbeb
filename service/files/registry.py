"""Which format reads a file (by its extension), and a file's translation through the serving
layer.

All the translatable texts of a file go to the model as one translation request: one text of
one line per file text (its whitespace runs collapsed to one space), so the sentence
segmentation, the request limits, the queue and the deadline are those of any
``/v1/translate`` request, and line ``i`` of the answer is file text ``i``'s translation (the
segmenter keeps line breaks where they were and a translation holds none). A text's inline
elements (a paragraph's runs, HTML's inline elements) go with it and come back placed on its
translation by the alignment (``service/files/placement.py``). A file is refused
before any of it is read when it is over ``max_file_bytes`` (413), and before any is translated
when its text is over the request's character limit (413).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

from service.files.epub import read_epub
from service.files.office import office_reader
from service.files.pieces import Extracted, translatable, with_edges
from service.files.placement import to_document, to_texts, unchanged
from service.files.refusals import FileTooLarge, UnsupportedFile
from service.files.safe_zip import ZipLimits
from service.files.text_formats import read_html, read_markdown, read_srt, read_txt
from service.metrics import FILE_BYTES, FILES, labelled
from service.serving.failures import SERVING_ERRORS, InternalError, failure_of
from service.serving.runtime import Runtime
from service.serving.submit import Client
from service.serving.terminology import Terminology
from service.serving.translation import NO_TERMINOLOGY, TranslationRequest, translate
from service.settings import Settings


@dataclass(frozen=True)
class FileFormat:
    extension: str
    media_type: str
    # the file's bytes, the archive limits, and whether HTML's inline elements are read as such
    read: Callable[[bytes, ZipLimits, bool], Extracted]


def _text(read: Callable[[bytes], Extracted]) -> Callable[[bytes, ZipLimits, bool], Extracted]:
    return lambda data, _limits, _inline: read(data)


def _html(data: bytes, _limits: ZipLimits, inline: bool) -> Extracted:
    return read_html(data, inline)


FORMATS: dict[str, FileFormat] = {
    f.extension: f
    for f in (
        FileFormat(".txt", "text/plain; charset=utf-8", _text(read_txt)),
        FileFormat(".md", "text/markdown; charset=utf-8", _text(read_markdown)),
        FileFormat(".srt", "application/x-subrip; charset=utf-8", _text(read_srt)),
        FileFormat(".html", "text/html; charset=utf-8", _html),
        FileFormat(".htm", "text/html; charset=utf-8", _html),
        FileFormat(
            ".docx",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            office_reader(".docx"),
        ),
        FileFormat(
            ".pptx",
            "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            office_reader(".pptx"),
        ),
        FileFormat(".odt", "application/vnd.oasis.opendocument.text", office_reader(".odt")),
        FileFormat(".odp", "application/vnd.oasis.opendocument.presentation", office_reader(".odp")),
        FileFormat(".epub", "application/epub+zip", read_epub),
    )
}


@dataclass(frozen=True)
class FileRequest:
    """A file to translate: ``source`` "auto" detects the file's language, None lets the model's
    route decide; ``first_of_several`` and ``api_key`` as in ``TranslationRequest``."""

    filename: str
    data: bytes
    source: str | None
    target: str | None
    model: str | None = None
    first_of_several: bool = False
    api_key: str | None = None
    terminology: Terminology = NO_TERMINOLOGY


@dataclass(frozen=True)
class TranslatedFile:
    filename: str  # the uploaded name
    media_type: str
    data: bytes
    model: str
    source_language: str
    target_language: str
    characters: int  # of the text sent to translation (DeepL bills these)


def file_format(filename: str) -> FileFormat:
    """The format of ``filename``'s extension; 415 for one none reads."""
    extension = os.path.splitext(filename)[1].lower()
    found = FORMATS.get(extension)
    if found is None:
        accepted = ", ".join(FORMATS)
        raise UnsupportedFile(
            f"{extension or 'a file without an extension'} is not translated (accepted: {accepted})"
        )
    return found


def _aligns(runtime: Runtime, request: FileRequest) -> bool:
    """Whether every model the file may go to has alignments (the one named, else any): only
    then are an HTML file's inline elements read as part of their sentence."""
    named = runtime.translation_models.get(request.model) if request.model else None
    models = [named] if named else list(runtime.translation_models.values())
    return bool(models) and all(
        m.engine.manifest.translation and m.engine.manifest.translation.has_alignments for m in models
    )


def zip_limits(settings: Settings) -> ZipLimits:
    return ZipLimits(
        max_entries=settings.max_archive_entries,
        max_uncompressed_bytes=settings.max_archive_uncompressed_bytes,
        max_ratio=settings.max_archive_ratio,
    )


async def translate_file(runtime: Runtime, client: Client, request: FileRequest) -> TranslatedFile:
    """The file translated, or a refusal: ``service.files.refusals`` or the serving layer's; each
    file counted in ``tserve_files_total`` by format and outcome, its size in ``tserve_file_bytes``
    (a client that leaves gets no answer, and its file no outcome)."""
    extension = os.path.splitext(request.filename)[1].lower()
    label = extension.removeprefix(".") if extension in FORMATS else "other"
    labelled(FILE_BYTES, label).observe(len(request.data))
    try:
        translated = await _translate_file(runtime, client, request)
    except SERVING_ERRORS as refused:
        labelled(FILES, label, failure_of(refused).type).inc()
        raise
    except Exception:
        labelled(FILES, label, InternalError.type).inc()
        raise
    labelled(FILES, label, "ok").inc()
    return translated


async def _translate_file(runtime: Runtime, client: Client, request: FileRequest) -> TranslatedFile:
    settings = runtime.settings
    if len(request.data) > settings.max_file_bytes:
        message = f"the file has {len(request.data)} bytes, more than {settings.max_file_bytes}"
        raise FileTooLarge(message, limit=settings.max_file_bytes)
    fmt = file_format(request.filename)
    extracted = await asyncio.to_thread(
        fmt.read, request.data, zip_limits(settings), _aligns(runtime, request)
    )
    sent = [i for i, text in enumerate(extracted.texts) if translatable(text)]
    lines = [" ".join(extracted.texts[i].split()) for i in sent]
    elements = [extracted.elements[i] if extracted.elements else () for i in sent]
    document = "\n".join(lines)
    most = min(runtime.limits.max_chars, runtime.limits.max_translate_chars)
    if len(document) > most:
        message = f"the file holds {len(document)} characters of text, more than {most}"
        raise FileTooLarge(message, limit=most)
    asked = TranslationRequest(
        texts=[document],  # one text: source "auto" detects one language in all of the file's text
        field="file",
        model=request.model,
        source=request.source,
        target=request.target,
        first_of_several=request.first_of_several,
        api_key=request.api_key,
        terminology=request.terminology,
        elements=[to_document([extracted.texts[i] for i in sent], elements)] if any(elements) else (),
    )
    done = await translate(runtime, client, asked)
    translated_lines = done.texts[0].hypotheses[0].text.split("\n") if lines else []
    if len(translated_lines) != len(lines):
        raise InternalError(f"{len(lines)} file texts came back as {len(translated_lines)} lines")
    translations = list(extracted.texts)
    ranges = [
        unchanged(extracted.elements[i] if extracted.elements else ()) for i in range(len(translations))
    ]
    originals = [extracted.texts[i] for i in sent]
    placed = to_texts(done.texts[0].placed, translated_lines, originals, [len(e) for e in elements])
    for i, line, where in zip(sent, translated_lines, placed, strict=True):
        translations[i] = with_edges(extracted.texts[i], line)
        ranges[i] = where
    data = await asyncio.to_thread(extracted.rebuild, translations, ranges)
    return TranslatedFile(
        filename=request.filename,
        media_type=fmt.media_type,
        data=data,
        model=done.model,
        source_language=done.source_language,
        target_language=done.target_language,
        characters=len(document),
    )
