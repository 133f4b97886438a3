"""The shape of the product code: no function over 80 lines, no module over 600 (issue 16), and no more
than 16 modules directly in ``registry/`` (issue 27: a new one joins the subpackage it serves).

A function's length runs from its first decorator (or ``def``) to its last line, docstring and
comments included. Every product package is scanned: ``registry``, ``loader``, ``placement``,
``provenance``, ``kernels``, ``deploy`` and ``src/shardport``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("registry", "loader", "placement", "provenance", "kernels", "deploy", "src/shardport")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
MAX_REGISTRY_TOP_LEVEL = 16

# Known offenders, by "path" or "path::function"; empty since issue 16. An entry that no longer
# offends fails the test too, so the list can only shrink.
ALLOWED: set[str] = set()


def _modules() -> Iterator[Path]:
    for package in PRODUCT:
        yield from sorted((ROOT / package).rglob("*.py"))


def _functions(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method, nested ones included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    assert child.end_lineno is not None
                    yield name, child.end_lineno - first + 1
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _offenders() -> dict[str, str]:
    found = {}
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found[rel] = f"module of {lines} lines (at most {MAX_MODULE_LINES})"
        for name, length in _functions(ast.parse(text, filename=rel)):
            if length > MAX_FUNCTION_LINES:
                found[f"{rel}::{name}"] = f"function of {length} lines (at most {MAX_FUNCTION_LINES})"
    return found


def test_no_long_functions_or_modules() -> None:
    found = _offenders()
    new = {key: why for key, why in found.items() if key not in ALLOWED}
    assert not new, "split these by responsibility:\n" + "\n".join(
        f"{k}: {v}" for k, v in sorted(new.items())
    )
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"no longer over the limit, remove from ALLOWED: {stale}"


def test_the_scan_sees_functions_and_methods() -> None:
    tree = ast.parse(
        "@d\ndef f():\n    pass\nclass C:\n    def m(self):\n        def inner():\n            pass\n"
    )
    assert dict(_functions(tree)) == {"f": 3, "C.m": 3, "C.m.inner": 2}
    assert len(list(_modules())) > 100


def test_registry_top_level_stays_small() -> None:
    """``registry/*.py`` (``__init__`` included): commands and the few modules every room shares."""
    top = sorted(p.name for p in (ROOT / "registry").glob("*.py"))
    assert len(top) <= MAX_REGISTRY_TOP_LEVEL, (
        f"registry/ holds {len(top)} modules (at most {MAX_REGISTRY_TOP_LEVEL}): {top}; put the new one in "
        "the subpackage it serves (checkpoint/, output/, artifact/, trust/, ...)"
    )
