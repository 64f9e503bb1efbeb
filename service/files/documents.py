"""Documents translated in the background (DeepL's ``/v2/document``): upload, poll, download once.

Each document is one ``translate_file`` (``service/files/registry.py``) run as a task of its own,
through the same queue as every request. At most ``max_in_flight`` are queued or translating at
once: the next upload is refused (429) rather than queued without bound, and an accepted one is
never dropped. A finished document waits ``ttl_s`` for its download, the finished ones within
``max_bytes`` together (the oldest go first), and its result is given once. Each is readable
only with its ``document_key`` and by the API key that uploaded it (another key: not found).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Literal, TypeVar

from service.files.registry import FileRequest, TranslatedFile, translate_file
from service.serving.failures import SERVING_ERRORS, Forbidden, ServiceError, failure_of
from service.serving.runtime import Runtime

T = TypeVar("T")
Status = Literal["queued", "translating", "done", "error"]


class DocumentNotFound(ServiceError, status=404, kind="document_not_found"):
    pass


class DocumentNotReady(ServiceError, status=503, kind="document_not_ready"):
    pass


class TooManyDocuments(ServiceError, status=429, kind="too_many_documents"):
    pass


@dataclass
class Document:
    id: str
    key: str
    owner: str | None  # the API key that uploaded it
    started_at: float
    status: Status = "queued"
    result: TranslatedFile | None = None
    error: str | None = None
    kept_until: float = float("inf")  # set when it finishes


class _InBackground:
    """The serving layer's ``Client`` for a document: nobody waits on a connection for it, and its
    stages are timed for no one."""

    def timed(self, stage: str, description: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    async def unless_gone(self, work: Awaitable[T]) -> T:
        return await work


class Documents:
    def __init__(self, max_in_flight: int, ttl_s: float, max_bytes: int) -> None:
        self.max_in_flight = max_in_flight
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._documents: OrderedDict[str, Document] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, runtime: Runtime, request: FileRequest) -> Document:
        """``request`` accepted for translation in the background, or 429 when too many are in flight."""
        self._expire()
        if len(self._tasks) >= self.max_in_flight:
            raise TooManyDocuments(
                f"{self.max_in_flight} documents are being translated; retry later",
                limit=self.max_in_flight,
                headers={"Retry-After": "5"},
            )
        document = Document(secrets.token_hex(16), secrets.token_hex(32), request.api_key, time.monotonic())
        self._documents[document.id] = document
        task = asyncio.create_task(
            self._translate(runtime, request, document), name=f"document-{document.id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return document

    def find(self, document_id: str, key: str, owner: str | None) -> Document:
        """The document, for its uploader only (404 otherwise) and with its key (403 otherwise)."""
        self._expire()
        document = self._documents.get(document_id)
        if document is None or document.owner != owner:
            raise DocumentNotFound("Document not found")
        if not secrets.compare_digest(document.key.encode(), key.encode()):
            raise Forbidden("invalid document_key")
        return document

    def take(self, document: Document) -> TranslatedFile:
        """Its translated file, given once; 503 while it is being translated."""
        if document.status == "error":
            raise DocumentNotFound(f"the document's translation failed: {document.error}")
        if document.result is None:
            raise DocumentNotReady("Document not ready")
        del self._documents[document.id]
        return document.result

    async def _translate(self, runtime: Runtime, request: FileRequest, document: Document) -> None:
        document.status = "translating"
        try:
            document.result = await translate_file(runtime, _InBackground(), request)
            document.status = "done"
        except SERVING_ERRORS as e:
            document.status, document.error = "error", failure_of(e).message
        except Exception:  # a bug: counted by translate_file; the document says so
            document.status, document.error = "error", "internal error"
        document.kept_until = time.monotonic() + self.ttl_s
        self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        finished = [d for d in self._documents.values() if d.kept_until != float("inf")]
        kept = sum(len(d.result.data) for d in finished if d.result is not None)
        for document in finished:  # oldest first
            if document.kept_until <= now or kept > self.max_bytes:
                kept -= len(document.result.data) if document.result is not None else 0
                del self._documents[document.id]
