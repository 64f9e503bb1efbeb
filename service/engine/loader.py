"""Open an artefact directory as the engine its manifest asks for."""

from __future__ import annotations

from pathlib import Path

from service.artefacts import ArtefactError, read_manifest
from service.engine.base import EmbedEngine, TranslateEngine
from service.engine.session import ProviderPref


def load_engine(
    directory: Path,
    *,
    provider: ProviderPref | str = "auto",
    intra_op_threads: int = 0,
    inter_op_threads: int = 1,
    allow_spinning: bool = True,
    max_batch_size: int = 64,
    max_batch_tokens: int = 16384,
    max_decode_rows: int = 512,
    device_id: int = 0,
) -> EmbedEngine | TranslateEngine:
    """Verify (sha256 of every listed file) and load; ``ArtefactError`` names the bad file.

    Embedding engines use ``max_batch_size``/``max_batch_tokens`` for their sub-batches;
    translation engines bound sentences × beam per search call by ``max_decode_rows``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtefactError(f"{directory}: artefact directory missing")
    task = read_manifest(directory).task  # cheap dispatch; the engine verifies every file
    if task == "embed":
        from service.engine.embedder import OnnxEmbedder  # each engine's imports only when served

        return OnnxEmbedder(
            directory,
            provider,
            intra_op_threads,
            inter_op_threads=inter_op_threads,
            allow_spinning=allow_spinning,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            device_id=device_id,
        )
    if task == "translate":
        from service.engine.translator import OnnxTranslator

        return OnnxTranslator(
            directory,
            provider,
            intra_op_threads,
            inter_op_threads=inter_op_threads,
            allow_spinning=allow_spinning,
            max_decode_rows=max_decode_rows,
            device_id=device_id,
        )
    raise ArtefactError(f"{directory / 'manifest.json'}: unknown task {task!r}")
