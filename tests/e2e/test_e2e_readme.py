"""Every ``curl`` example of README.md, run as written by the real ``curl`` against the real
service, with only its ``localhost:8000`` pointed at the test server: each must answer 2xx with
a JSON body (``/metrics`` excepted: Prometheus text) holding what was asked for: one non-empty
result per text sent, as many hypotheses or alternatives as requested.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.real_models import served_env, start_service
from tests.servers import ROOT, ServerProcess
from tests.tiny_cross_encoder import tiny_rerank_artefact

# The default service is asked for by name (``request.getfixturevalue``); its export named here puts
# the file among those that run once the export is done (tests/conftest.py), not waiting for it.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("default_artefacts")]

README = ROOT / "README.md"
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
DOCUMENTED_URL = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):8000")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}
TEXT_PATHS = {"/metrics"}  # the one documented route that does not answer JSON
STATUS_MARK = "\n--e2e-status--"


def readme_curl_commands() -> list[str]:
    """Each ``curl`` command line of the README's shell blocks, backslash continuations joined."""
    commands = []
    for block in SHELL_BLOCK.findall(README.read_text(encoding="utf-8")):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            words = line.strip().removeprefix("$ ")
            if words.startswith("curl "):
                commands.append(words)
    return commands


COMMANDS = readme_curl_commands() if README.is_file() else []


def _id(command: str) -> str:
    found = re.search(r":8000(/[^\s'\"?]*)", command)
    return found.group(1) if found else command[:40]


def test_the_readme_shows_every_model_endpoint_with_curl() -> None:
    paths = {_id(c) for c in COMMANDS}
    assert {"/v1/translate", "/v1/embed", "/v1/embeddings", "/v1/models"} <= paths, paths


# The README's reranking example serves a cross-encoder by this name: here a tiny one with
# random weights, exported by the project's export, as the only model of a second service.
RERANK_MODEL = "ms-marco-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def rerank_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("rerank-artefacts")
    tiny_rerank_artefact(root, name=RERANK_MODEL, variant="int8")
    env = served_env(
        root, "int8", TSERVE_RERANK_MODEL=RERANK_MODEL, TSERVE_TRANSLATE_MODEL="", TSERVE_EMBED_MODEL=""
    )
    yield from start_service(tmp_path_factory, "rerank-service", env)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{i}:{_id(c)}" for i, c in enumerate(COMMANDS)])
def test_readme_curl_example_succeeds(command: str, request: pytest.FixtureRequest) -> None:
    service: ServerProcess = request.getfixturevalue(
        "rerank_service" if _id(command) == "/v1/rerank" else "service"
    )
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("the `curl` binary is not installed")
    words = shlex.split(command, comments=True)
    cut = next((i for i, w in enumerate(words) if w in SHELL_OPERATORS), len(words))
    args = [DOCUMENTED_URL.sub(service.url, w) for w in words[1:cut]]  # the curl part of a pipeline
    assert sum(service.url in a for a in args) == 1, f"no single http://localhost:8000 URL in: {command}"
    done = subprocess.run(
        [curl, *args, "--max-time", "120", "--write-out", STATUS_MARK + "%{http_code} %{content_type}"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"curl failed ({done.returncode}): {done.stderr}"
    body, _, status_line = done.stdout.rpartition(STATUS_MARK)
    status, _, content_type = status_line.partition(" ")
    assert status.startswith("2"), f"HTTP {status} for {command}:\n{body}"
    if _id(command) in TEXT_PATHS:
        assert body.strip()
        return
    assert content_type.startswith("application/json"), content_type
    check_answer(_id(command), sent_body(args), json.loads(body))


def sent_body(curl_args: list[str]) -> dict[str, Any]:
    """The JSON a curl command line sends with -d / --data, {} when it sends none."""
    for flag, value in itertools.pairwise(curl_args):
        if flag in ("-d", "--data", "--data-raw"):
            sent: dict[str, Any] = json.loads(value)
            return sent
    return {}


def _texts(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def check_answer(path: str, sent: dict[str, Any], answer: Any) -> None:
    """The answer of a documented route holds a result for everything ``sent`` asked for."""
    if path == "/v1/translate":
        translations = answer["translations"]
        assert len(translations) == len(_texts(sent["text"])), answer
        for translation in translations:
            assert len(translation["hypotheses"]) == sent.get("n_best", 1), translation
            assert all(h["text"].strip() for h in translation["hypotheses"]), translation
    elif path == "/v1/embed":
        assert answer["dim"] > 0 and len(answer["embeddings"]) == len(sent["texts"]), answer
        assert all(len(e) == answer["dim"] for e in answer["embeddings"])
    elif path == "/embed":  # TEI's shape: one vector per input, all of one dimension
        assert len(answer) == len(_texts(sent["inputs"])) and answer[0], answer
        assert all(isinstance(v, list) and len(v) == len(answer[0]) for v in answer)
    elif path == "/v1/embeddings":
        assert len(answer["data"]) == len(_texts(sent["input"])), answer
        assert all(isinstance(d["embedding"], list) and d["embedding"] for d in answer["data"])
    elif path == "/translate":  # LibreTranslate's shape: one string in, one string out
        assert isinstance(answer["translatedText"], str) and answer["translatedText"].strip(), answer
        assert len(answer.get("alternatives", [])) == sent.get("alternatives", 0), answer
    elif path == "/detect":  # LibreTranslate's shape: candidates, best first
        assert answer and answer[0]["language"] == "de" and answer[0]["confidence"] > 0, answer
    elif path == "/v1/rerank":  # Cohere's shape: every document scored, best first
        scores = [r["relevance_score"] for r in answer["results"]]
        assert sorted(r["index"] for r in answer["results"]) == list(range(len(sent["documents"]))), answer
        assert scores == sorted(scores, reverse=True), answer
    elif path == "/v1/models":
        assert {card["task"] for card in answer["data"]} == {"translate", "embed"}, answer
    elif path == "/languages":
        assert all(lang["code"] for lang in answer) and any(lang["targets"] for lang in answer), answer
    elif path == "/health/live":
        assert answer["status"] == "alive", answer
    elif path == "/health/ready":
        assert answer["status"] == "ready", answer
    else:
        pytest.fail(f"the README documents {path} with curl: say here what its answer must hold")
