"""Open an artefact directory as the engine its manifest asks for."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from service.artefacts import ArtefactError, read_manifest
from service.engine.base import EmbedEngine, TranslateEngine
from service.engine.session import DEFAULT_SESSION, SessionConfig
from service.engine.tokenizer import SubBatches

if TYPE_CHECKING:
    from service.engine.reranker import RerankEngine


def load_engine(
    directory: Path,
    session: SessionConfig = DEFAULT_SESSION,
    *,
    max_batch_size: int = 64,
    max_batch_tokens: int = 16384,
    max_decode_rows: int = 512,
    shortlist: bool = False,
) -> EmbedEngine | TranslateEngine | RerankEngine:
    """Verify (sha256 of every listed file) and load; ``ArtefactError`` names the bad file.

    Embedding and rerank engines use ``max_batch_size``/``max_batch_tokens`` for their sub-batches;
    translation engines bound sentences × beam per search call by ``max_decode_rows`` and, with
    ``shortlist``, decode over each sentence's vocabulary shortlist (an export with ``--vmap``).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtefactError(f"{directory}: artefact directory missing")
    task = read_manifest(directory).task  # cheap dispatch; the engine verifies every file
    if task == "embed":
        from service.engine.embedder import OnnxEmbedder  # each engine's imports only when served

        return OnnxEmbedder(directory, session, SubBatches(max_batch_size, max_batch_tokens))
    if task == "rerank":
        from service.engine.reranker import OnnxReranker

        return OnnxReranker(directory, session, SubBatches(max_batch_size, max_batch_tokens))
    if task == "translate":
        from service.engine.translation.translator import OnnxTranslator

        return OnnxTranslator(directory, session, max_decode_rows=max_decode_rows, shortlist=shortlist)
    raise ArtefactError(f"{directory / 'manifest.json'}: unknown task {task!r}")
