"""GGUF header: ``general.quantization_version`` gated, the key/value range and its manifest digest."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from shardport.registry.artifact.gguf_header import check_header_bytes, header_digest
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, GgufHeaderDigest, Manifest
from shardport.registry.artifact.manifest_check import check_manifest
from shardport.registry.errors import HeaderDigestMismatchError, ManifestInconsistentError
from shardport.registry.formats import errors as E
from shardport.registry.formats import parse_gguf
from shardport.registry.formats.gguf_gate import QUANTIZATION_VERSIONS


def _write(path: Path, add_version: str | None, version: int = 2) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if add_version == "uint32":
        w.add_quantization_version(version)
    elif add_version == "int32":
        w.add_int32("general.quantization_version", version)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(80)])
    w.add_tensor(
        "blk.0.attn_q.weight",
        gguf.quants.quantize(np.ones((2, 32), np.float32), gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_versions_are_gguf_s() -> None:
    assert QUANTIZATION_VERSIONS == {gguf.GGML_QUANT_VERSION} == {2}


@pytest.mark.parametrize("add", [None, "uint32"])
def test_current_or_absent_version_is_accepted(tmp_path: Path, add: str | None) -> None:
    header = parse_gguf(_write(tmp_path / "m.gguf", add))
    assert header.kv.get("general.quantization_version", 2) == 2


@pytest.mark.parametrize(
    ("add", "version", "found"),
    [("uint32", 1, "UINT32 1"), ("uint32", 3, "UINT32 3"), ("int32", 2, "INT32 2")],
)
def test_other_versions_are_refused_by_name(tmp_path: Path, add: str, version: int, found: str) -> None:
    path = _write(tmp_path / "old.gguf", add, version)
    with pytest.raises(E.QuantizationVersionError) as err:
        parse_gguf(path)
    e = err.value
    assert (e.field, e.found) == ("general.quantization_version", found)
    assert "[2]" in e.expected and str(path) in str(e) and e.exit_code == 5


def test_kv_end_is_where_the_tensor_infos_start(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", "uint32")
    header = parse_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert header.kv_end == int(reader.tensors[0].field.offset)  # gguf-py's own parse of the file
    raw = path.read_bytes()
    record = header_digest(path, header)
    assert record == GgufHeaderDigest(end=header.kv_end, digest=digest_bytes(raw[: header.kv_end]))
    check_header_bytes(record, raw[: record.end], file="m.gguf")  # a range-reading consumer's check
    with pytest.raises(HeaderDigestMismatchError, match="bytes instead of"):
        check_header_bytes(record, raw[: record.end - 1], file="m.gguf")
    flipped = bytearray(raw[: record.end])
    flipped[record.end - 3] ^= 1
    with pytest.raises(HeaderDigestMismatchError, match=r"m\.gguf: GGUF header bytes \[0, "):
        check_header_bytes(record, bytes(flipped), file="m.gguf")


def _manifest(path: str, size: int, header: GgufHeaderDigest | None) -> Manifest:
    entry = FileEntry(path=path, size=size, digest=digest_bytes(b"x"), gguf_header=header)
    return Manifest(container=ContainerInfo(kind="gguf"), files=[entry])


def test_the_field_is_additive_and_checked() -> None:
    plain = _manifest("model.safetensors", 10, None)
    assert b"gguf_header" not in plain.to_bytes()  # manifests without GGUF files keep their bytes
    record = GgufHeaderDigest(end=8, digest=digest_bytes(b"GGUF"))
    good = _manifest("model.gguf", 10, record)
    assert Manifest.from_bytes(good.to_bytes()) == good
    check_manifest(good, source="m")
    for bad in (_manifest("model.gguf", 7, record), _manifest("model.bin", 10, record)):
        with pytest.raises(ManifestInconsistentError, match="gguf_header"):
            check_manifest(bad, source="m")
