from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.registry.errors import SchemaVersionError, UsageError, VerificationError
from shardport.registry.manifest import ContainerInfo, FileEntry, Manifest, ModelInfo


def sample() -> Manifest:
    return Manifest(
        container=ContainerInfo(kind="safetensors"),
        model=ModelInfo(
            architecture="LlamaForCausalLM", params={"rms_norm_eps": 1e-05, "rope_theta": 500000.0}
        ),
        files=[FileEntry(path="model.safetensors", size=10, digest="sha256:" + "a" * 64)],
    )


def test_canonical_and_digest_stable() -> None:
    m = sample()
    raw = m.to_bytes()
    assert raw == Manifest.from_bytes(raw).to_bytes()
    assert m.digest() == Manifest.from_bytes(raw).digest()
    assert b" " not in raw and raw.index(b'"container"') < raw.index(b'"files"')
    assert b'"rope_theta":500000' in raw


def test_unknown_optional_fields_are_kept() -> None:
    doc = json.loads(sample().to_bytes())
    doc["future_section"] = {"x": [1, 2]}
    doc["model"]["future_field"] = "kept"
    m = Manifest.from_bytes(json.dumps(doc).encode())
    assert b'"future_section":{"x":[1,2]}' in m.to_bytes()
    assert b'"future_field":"kept"' in m.to_bytes()


@pytest.mark.parametrize(
    "section", ["container", "model", "quantization", "packing", "runtime", "provenance", "schema"]
)
def test_newer_section_version_rejected(section: str) -> None:
    doc = json.loads(sample().to_bytes())
    doc.setdefault(section, {})["version"] = 2
    with pytest.raises(SchemaVersionError, match=f"'{section}': version 2"):
        Manifest.from_bytes(json.dumps(doc).encode(), source="m.json")


def test_out_of_range_integer_is_a_usage_error() -> None:
    m = Manifest(container=ContainerInfo(kind="x"), model=ModelInfo(params={"big": 2**60}), files=[])
    with pytest.raises(UsageError, match=r"2\*\*53"):
        m.to_bytes()


def test_wrong_schema_and_bad_fields() -> None:
    doc = json.loads(sample().to_bytes())
    doc["schema"]["id"] = "other"
    with pytest.raises(SchemaVersionError, match="schema id"):
        Manifest.from_bytes(json.dumps(doc).encode())
    doc = json.loads(sample().to_bytes())
    doc["files"][0]["size"] = -1
    with pytest.raises(VerificationError, match=r"files\.0\.size"):
        Manifest.from_bytes(json.dumps(doc).encode(), source="m.json")
    with pytest.raises(VerificationError, match="not valid JSON"):
        Manifest.from_bytes(b"{", source="m.json")


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e15, max_value=1e15)
)


@settings(max_examples=60, deadline=None)
@given(
    params=st.dictionaries(st.text(min_size=1, max_size=8), json_scalars, max_size=5),
    files=st.lists(st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 2**40)), max_size=4),
    arch=st.none() | st.text(max_size=10),
)
def test_roundtrip_property(
    params: dict[str, object], files: list[tuple[str, int]], arch: str | None
) -> None:
    m = Manifest(
        container=ContainerInfo(kind="gguf"),
        model=ModelInfo(architecture=arch, params=params),
        files=[FileEntry(path=p, size=s, digest="sha256:" + "b" * 64) for p, s in files],
    )
    raw = m.to_bytes()
    back = Manifest.from_bytes(raw)
    assert back.to_bytes() == raw
    assert back.digest() == m.digest()
