from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.registry.artifact.hashing import check_digest, hex_of, is_digest
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, Manifest, ModelInfo, TensorEntry
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.errors import (
    MalformedDigestError,
    ManifestInconsistentError,
    SchemaVersionError,
    UnsafePathError,
    UsageError,
    VerificationError,
)
from shardport.registry.store.keys import blob_key


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


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:../../../../etc/passwd",
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 64 + "\n",
        "sha512:" + "a" * 64,
        "",
    ],
)
@pytest.mark.parametrize(
    "where",
    [
        ("files", 0, "digest"),
        ("tile_index", "digest"),
        ("provenance", "parent"),
        ("provenance", "source_manifest"),
        ("provenance", "source_digest"),
        ("model", "tokenizer_digest"),
        ("quantization", "config_digest"),
    ],
)
def test_every_digest_field_has_one_form(bad: str, where: tuple[str | int, ...]) -> None:
    doc = json.loads(sample().to_bytes())
    doc["tile_index"] = {"digest": "sha256:" + "c" * 64}
    node = doc
    for key in where[:-1]:
        node = node[key]  # type: ignore[index]
    node[where[-1]] = bad  # type: ignore[index]
    field = ".".join(str(k) for k in where)
    with pytest.raises(MalformedDigestError, match=rf"m\.json: field '{field}'.*expected 'sha256:'"):
        Manifest.from_bytes(json.dumps(doc).encode(), source="m.json")


def test_digest_helpers_refuse_other_forms() -> None:
    good = "sha256:" + "0" * 64
    assert check_digest(good) == good and hex_of(good) == "0" * 64 and is_digest(good)
    for bad in ["sha256:../../../../etc/passwd", good + "\n", good.upper(), 7, None]:
        assert not is_digest(bad)
        with pytest.raises(MalformedDigestError):
            check_digest(bad)
    with pytest.raises(MalformedDigestError, match="etc/passwd"):
        blob_key("sha256:../../../../etc/passwd")  # the store's last line of defence


def tensor_manifest(**change: object) -> Manifest:
    """A consistent manifest with one weight of two planes, with ``change`` applied to ``tensors[0]``."""
    tensors = [
        TensorEntry(name="w", file="model.safetensors", start=8, end=40, dtype="F16", shape=(4, 4)),
        TensorEntry(name="b", file="model.safetensors", start=40, end=48, dtype="F16", shape=(4,)),
    ]
    tensors[0] = tensors[0].model_copy(update=change)
    return Manifest(
        container=ContainerInfo(kind="safetensors"),
        files=[FileEntry(path="model.safetensors", size=48, digest="sha256:" + "a" * 64)],
        tensors=tensors,
    )


def test_consistent_manifest_passes() -> None:
    check_manifest(tensor_manifest(), source="manifest X")


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"file": "missing.safetensors"}, "tensors.0.file", "'files' does not list"),
        ({"file": "Model.safetensors"}, "tensors.0.file", "differs only in case"),
        ({"end": 49}, "tensors.0.end", r"not inside 'model.safetensors' \(48 bytes\)"),
        ({"start": 41, "end": 40}, "tensors.0.end", "not inside"),
        ({"shape": (4, -4)}, "tensors.0.shape", "negative"),
        ({"shape": (4, 5)}, "tensors.0.dtype", "holds 32"),
        ({"dtype": "X9"}, "tensors.0.dtype", "no known element"),
        ({"name": "b"}, "tensors.1.name", "listed twice"),
        ({"weight": "nowhere"}, "tensors.0.weight", "'weights' does not list"),
        ({"layout": "zigzag"}, "tensors.0.layout", "expected 'row_major'"),
        ({"layout": "shardport-tiled", "tile_rows": 2}, "tensors.0.tile_rows", "positive tile_rows"),
        ({"layout": "shardport-tiled", "tile_rows": 2, "tile_cols": -1}, "tensors.0.tile_rows", "positive"),
    ],
)
def test_inconsistent_tensor_table(change: dict[str, object], field: str, text: str) -> None:
    m = tensor_manifest(**change)
    if "weight" in change:
        m = m.model_copy(update={"weights": []})
    with pytest.raises(ManifestInconsistentError, match=rf"manifest X: field '{field}' = .*{text}"):
        check_manifest(m, source="manifest X")


def test_unicode_form_variant_of_a_file_is_not_that_file() -> None:
    nfc = "modèle.safetensors"
    m = tensor_manifest(file=unicodedata.normalize("NFD", nfc))
    m = m.model_copy(update={"files": [m.files[0].model_copy(update={"path": nfc})]})
    with pytest.raises(ManifestInconsistentError, match="differs only in case or Unicode form"):
        check_manifest(m, source="manifest X")


def test_paths_in_a_manifest_follow_the_path_rules() -> None:
    m = tensor_manifest()
    bad = m.model_copy(update={"files": [m.files[0].model_copy(update={"path": "a\u202etxt"})]})
    with pytest.raises(UnsafePathError, match="U\\+202E"):
        check_manifest(bad, source="manifest X")


OLDER = (
    b'{"container":{"kind":"gguf","profile_version":1,"spec_revision":null,"version":1},'
    b'"files":[{"digest":"sha256:' + b"a" * 64 + b'","path":"m.gguf","size":10}],'
    b'"mediaType":"application/vnd.shardport.manifest.v1+json",'
    b'"model":{"architecture":null,"params":{},"revision":null,"tokenizer_digest":null,"version":1},'
    b'"notes":[],"packing":{"encoding":null,"layout":null,"layout_version":null,"packer":null,'
    b'"packer_version":null,"version":1},"producer_witness":null,"provenance":{"converter":null,'
    b'"converter_version":null,"created_at":null,"parent":null,"source_digest":null,'
    b'"source_manifest":null,"version":1},"quantization":{"calibration_digest":null,"config_digest":null,'
    b'"family":"none","producer":null,"producer_version":null,"version":1},"runtime":{"kernels_preferred":[],'
    b'"kernels_required":[],"name":null,"tested_version":null,"version":1},"schema":{"id":"shardport.manifest",'
    b'"version":1},"tensors":null,"tile_index":null,"topology":null,"weights":null}'
)
"""A manifest as pushed before the layers were filled (no tensor types, catalogue, expected kernels)."""


def test_a_manifest_without_the_new_layer_fields_keeps_its_bytes_and_digest() -> None:
    m = Manifest.from_bytes(OLDER)
    assert m.to_bytes() == OLDER
    assert m.runtime.expected_kernels is None and m.quantization.tensor_types is None and m.topology is None
