"""Frozen hostile containers in tests/vectors/containers: each must fail with the error its manifest names.

The files were produced once from the valid fixtures by the mutations in ``test_safetensors_gate.py``
and ``test_gguf_gate.py``; they are kept as bytes so that a change in safetensors or gguf-py writers
cannot silently change what the corpus tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardport.registry.formats import ContainerError, parse_gguf, parse_safetensors
from shardport.registry.formats import errors as E

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "containers"
MANIFEST: dict[str, dict[str, str | None]] = json.loads((VECTORS / "manifest.json").read_text())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_vector_fails_with_its_named_error(name: str) -> None:
    expected = MANIFEST[name]
    error = getattr(E, str(expected["error"]))
    assert issubclass(error, ContainerError)
    path = VECTORS / name
    parse = parse_gguf if name.endswith(".gguf") else parse_safetensors
    with pytest.raises(error) as info:
        parse(path)
    assert str(path) in str(info.value)
    if expected["tensor"] is not None:
        assert info.value.tensor == expected["tensor"]


def test_every_vector_is_listed() -> None:
    files = {p.name for p in VECTORS.iterdir() if p.suffix in {".gguf", ".safetensors"}}
    assert files == set(MANIFEST)
