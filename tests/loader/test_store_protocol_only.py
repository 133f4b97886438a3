"""The loader reaches storage only through the store protocol (issue 16).

No backend internals (``store.fs``, ``store.path(...)``, ``store.root``, ``store.reader``) and no
``is_local`` branch anywhere in ``loader/``: what differs by backend is a capability or a read hint of
:class:`~shardport.registry.store.protocol.Store` (``profile``, ``local_root``, ``open_local``,
``read_ranges``), and no loader module imports a backend module.
"""

from __future__ import annotations

import ast
from pathlib import Path

LOADER = Path(__file__).resolve().parents[2] / "loader"
BACKEND_ONLY = {"fs", "path", "root", "reader", "endpoint", "is_local"}
BACKEND_MODULES = ("backend", "local", "s3", "s3reads", "fsstore", "localfs", "localfiles")


def _store_expr(node: ast.expr) -> bool:
    """Whether ``node`` names a store (``store``, ``self._store``, ``session.store``, ...)."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.lstrip("_").endswith("store")


def offences(source: str, file: str) -> list[str]:
    """Every use of a backend internal, ``is_local`` or a backend module in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (
            node.attr == "is_local" or (node.attr in BACKEND_ONLY and _store_expr(node.value))
        ):
            found.append(f"{file}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "is_local":
            found.append(f"{file}:{node.lineno}: is_local")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardport.registry.store."):
            if (node.module or "").rsplit(".", 1)[-1] in BACKEND_MODULES:
                found.append(f"{file}:{node.lineno}: imports {node.module}")
    return found


def test_the_check_sees_each_kind_of_offence() -> None:
    bad = (
        "from shardport.registry.store.backend import Store\n"
        "def f(store, session, self):\n"
        "    store.fs.cat_ranges([])\n"
        "    open(store.path('k'))\n"
        "    if session.store.is_local: pass\n"
        "    return self._store.root\n"
    )
    found = sorted(o.split(": ", 1)[1] for o in offences(bad, "x.py"))
    assert found == sorted(["imports shardport.registry.store.backend", ".fs", ".path", ".is_local", ".root"])
    assert offences("def f(entry):\n    return entry.path, f.root\n", "x.py") == []


def test_loader_uses_only_the_store_protocol() -> None:
    files = sorted(LOADER.rglob("*.py"))
    assert len(files) > 10
    found = [o for f in files for o in offences(f.read_text(), str(f.relative_to(LOADER.parent)))]
    assert found == [], "the loader reaches past the store protocol:\n" + "\n".join(found)
