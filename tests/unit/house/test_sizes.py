"""Small pieces (issue 39): no function over 60 lines and no module over 450 lines in
``actors/`` and ``supervision/`` (dev tooling aside: ``supervision/dev/`` is the embedded
stack, not the daemon)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def modules() -> list[Path]:
    return sorted(p for top in ("actors", "supervision") for p in (ROOT / top).rglob("*.py")
                  if "dev" not in p.relative_to(ROOT / top).parts)


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function or method of *source* longer than the limit."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_over_60_lines() -> None:
    found = [f"{p.relative_to(ROOT)}: {name} ({n} lines)"
             for p in modules() for name, n in long_functions(p.read_text())]
    assert found == []


def test_no_module_is_over_450_lines() -> None:
    found = [f"{p.relative_to(ROOT)}: {n} lines" for p in modules()
             if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert found == []


def test_the_size_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def short():\n    pass\n\ndef long():\n{body}\n") == [
        ("long", MAX_FUNCTION_LINES + 1)]
