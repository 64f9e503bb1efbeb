"""The user-facing docs stay true to the code and within their budgets.

docs/configuration.md documents every setting of ``service/settings.py``, and every settings table
(README.md's too) gives its exact default; no doc names a ``TSERVE_*`` variable that does not
exist; relative links resolve; README.md and benchmarks/README.md stay short enough to read
(issue 43); every concept keeps one name (docs/architecture.md's glossary: a retired name appears
in no doc and no module of the service), and every file a doc names exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic.fields import FieldInfo

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS_README = ROOT / "benchmarks" / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
USER_DOCS = [README, BENCHMARKS_README, *DOCS]
LINE_BUDGETS = {README: 400, BENCHMARKS_README: 300}

ENV_NAME = re.compile(r"\bTSERVE_[A-Z0-9_]*[A-Z0-9]")
SETTING_ROW = re.compile(r"^\| `(TSERVE_[A-Z0-9_]+)` \| `([^`]*)` \|", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A retired name → the concept's one name (docs/architecture.md, "Names").
RETIRED_NAMES = {
    r"\blanes?\b": "worker threads",
    r"\bmain decodes?\b": "worker threads",
    r"\bbatchers?\b": "request queue",
}
RETIRED = re.compile("|".join(RETIRED_NAMES), re.IGNORECASE)
# A path in the repository, as docs name files: `service/http/app.py`, docker/Dockerfile.
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:service|export|benchmarks|tests|docker|k8s|scripts)/[\w/.-]*\w)")
# What a command makes: named in the docs, never in the repository.
MADE_BY_COMMANDS = ("benchmarks/results", "benchmarks/.venv-infinity", "export/reference/sentences")
SERVICE_MODULES = sorted((ROOT / "service").rglob("*.py"))


def env_name(field: str) -> str:
    return f"TSERVE_{field.upper()}"


def documented_default(field: FieldInfo) -> str:
    """A default as configuration.md writes it: the value as an environment variable would
    spell it, ``unset`` for None, ``empty`` for an empty list."""
    value: Any = field.get_default(call_default_factory=True, validated_data={})
    if value is None:
        return "unset"
    if value == []:
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def code_defaults() -> dict[str, str]:
    return {env_name(name): documented_default(field) for name, field in Settings.model_fields.items()}


def test_every_setting_is_documented() -> None:
    documented = dict(SETTING_ROW.findall(CONFIGURATION.read_text(encoding="utf-8")))
    missing = sorted(code_defaults().keys() - documented.keys())
    assert not missing, f"docs/configuration.md has no row for {missing}"


@pytest.mark.parametrize("doc", [CONFIGURATION, README], ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_defaults_are_the_code_defaults(doc: Path) -> None:
    """Every settings-table row that gives a default as code (README's short table too)."""
    expected = code_defaults()
    rows = SETTING_ROW.findall(doc.read_text(encoding="utf-8"))
    assert rows, f"{doc.relative_to(ROOT)} has no settings table"
    wrong = {name: (value, expected.get(name)) for name, value in rows if value != expected.get(name)}
    assert not wrong, (
        f"{doc.relative_to(ROOT)}: defaults differ from service/settings.py (doc, code): {wrong}"
    )


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_existing_settings(doc: Path) -> None:
    known = {env_name(name) for name in Settings.model_fields}
    unknown = sorted(set(ENV_NAME.findall(doc.read_text(encoding="utf-8"))) - known)
    assert not unknown, f"{doc.relative_to(ROOT)} names settings that service/settings.py lacks: {unknown}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


@pytest.mark.parametrize("doc", list(LINE_BUDGETS), ids=lambda p: str(p.relative_to(ROOT)))
def test_readmes_stay_within_their_line_budget(doc: Path) -> None:
    lines = len(doc.read_text(encoding="utf-8").splitlines())
    assert lines <= LINE_BUDGETS[doc], f"{doc.relative_to(ROOT)}: {lines} lines, budget {LINE_BUDGETS[doc]}"


def retired_names_in(text: str) -> list[str]:
    return sorted({f"{m.group(0)} (now: {one_name(m.group(0))})" for m in RETIRED.finditer(text)})


def one_name(retired: str) -> str:
    return next(name for pattern, name in RETIRED_NAMES.items() if re.fullmatch(pattern, retired, re.I))


def test_the_retired_names_are_found() -> None:
    assert retired_names_in("each Batcher has two lanes") == [
        "Batcher (now: request queue)",
        "lanes (now: worker threads)",
    ]


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_use_one_name_per_concept(doc: Path) -> None:
    retired = retired_names_in(doc.read_text(encoding="utf-8"))
    assert not retired, f"{doc.relative_to(ROOT)} says {retired}"


def test_the_service_uses_one_name_per_concept() -> None:
    """Identifiers, docstrings and comments alike (a SIMD lane of the ranking kernel is not one
    of the service's concepts: ``lane`` is checked in docs only)."""
    code_names = re.compile("|".join(p for p in RETIRED_NAMES if "lane" not in p), re.IGNORECASE)
    found = [
        f"{path.relative_to(ROOT)}: {sorted(set(code_names.findall(text)))}"
        for path in SERVICE_MODULES
        if code_names.search(text := path.read_text(encoding="utf-8"))
    ]
    assert not found, found


@pytest.mark.parametrize(
    "doc", [*USER_DOCS, ROOT / "k8s" / "README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_file_a_doc_names_exists(doc: Path) -> None:
    named = set(NAMED_PATH.findall(doc.read_text(encoding="utf-8")))
    missing = sorted(p for p in named if not (ROOT / p).exists() and not p.startswith(MADE_BY_COMMANDS))
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def test_the_architecture_page_lists_every_top_level_module_of_the_service() -> None:
    """docs/architecture.md's "Layers" block names each package and loose module of service/, so
    the page matches the tree (the import contract itself is tests/test_layers.py's)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page.split("## Layers", 1)[1].split("```")[1]
    tops = [
        f"{p.name}/" if p.is_dir() else p.name
        for p in (ROOT / "service").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    ]
    missing = sorted(
        t for t in tops if not re.search(rf"(?<![\w/]){re.escape(t)}|service/{re.escape(t)}", block)
    )
    assert not missing, f"docs/architecture.md's Layers block does not name {missing}"
