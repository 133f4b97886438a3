"""Each package's public face: every exported name resolves, and the lists are what they claim."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "package",
    [
        "shardport.registry",
        "shardport.registry.contracts",
        "shardport.registry.checkpoint",
        "shardport.registry.output",
        "shardport.provenance",
        "shardport.loader",
        "shardport.placement",
    ],
)
def test_every_exported_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__ and len(module.__doc__.strip().splitlines()) > 3, package  # a docstring face
    names = module.__all__
    if package == "shardport.registry":
        assert sorted(names) == sorted(module._HOME), "__all__ and the lazy table must list the same names"
    for name in names:
        assert getattr(module, name) is not None, (package, name)


def test_registry_face_is_lazy() -> None:
    """Importing the package (every ``shardport.registry.x`` import does) loads none of the commands."""
    code = (
        "import sys, shardport.registry as r; "
        "print(sorted(m for m in sys.modules if m.startswith('shardport.registry.') or m in "
        "('numpy', 'pydantic', 'fsspec', 'gguf')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("shardport.registry").nope  # noqa: B018
