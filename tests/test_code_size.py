"""The service and the export stay readable: no module over 400 lines, no function over 80.

A long module holds more than one idea and a long function more than one step; past these
bounds, split by concept or by step (the style this project follows, DEVELOPERS.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "export")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_functions(tree: ast.AST) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_the_limits_see_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(ast.parse(f"def long():\n{body}\n")) == [f"long ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(ast.parse("def short():\n    return 1\n")) == []


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_its_functions_are_within_bounds(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
    too_long = long_functions(ast.parse(text))
    assert not too_long, f"{path.relative_to(ROOT)}: {', '.join(too_long)}"
