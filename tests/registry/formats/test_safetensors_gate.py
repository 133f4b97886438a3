"""The safetensors gate: agreement with safetensors on valid files, and one named error per hostile input."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from shardport.registry.formats import (
    BytesSource,
    ContainerError,
    SafetensorsLimits,
    parse_safetensors,
    parse_safetensors_source,
)
from shardport.registry.formats import errors as E
from shardport.registry.formats.safetensors_gate import DTYPE_BITS

NAME = "hostile.safetensors"
Q = "model.layers.0.q.weight"


def split(raw: bytes) -> tuple[dict[str, object], bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(header: dict[str, object] | str | bytes, data: bytes) -> bytes:
    if isinstance(header, dict):
        header = json.dumps(header)
    text = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    return struct.pack("<Q", len(text)) + text + data


def parse(raw: bytes, limits: SafetensorsLimits | None = None) -> object:
    return parse_safetensors_source(BytesSource(raw, NAME), limits)


def expect(
    raw: bytes, err: type[ContainerError], tensor: str | None = None, limits: SafetensorsLimits | None = None
) -> ContainerError:
    with pytest.raises(err) as info:
        parse(raw, limits)
    exc = info.value
    assert NAME in str(exc)
    assert exc.exit_code == 5
    if tensor is not None:
        assert repr(tensor) in str(exc)
        assert exc.tensor == tensor
    return exc


# --- valid files ------------------------------------------------------------------------------------


def test_agrees_with_safe_open(st_path: Path) -> None:
    header = parse_safetensors(st_path)
    raw = st_path.read_bytes()
    assert header.file_size == len(raw)
    assert header.data_offset == 8 + header.header_length
    assert dict(header.metadata) == {"format": "np", "producer": "shardport-tests"}
    starts = [t.start for t in header.tensors]
    assert starts == sorted(starts)
    with safe_open(str(st_path), "np") as f:
        assert sorted(f.keys()) == sorted(t.name for t in header.tensors)
        assert f.metadata() == dict(header.metadata)
        for rec in header.tensors:
            sl = f.get_slice(rec.name)
            assert sl.get_dtype() == rec.dtype
            assert list(sl.get_shape()) == list(rec.shape)
            array = f.get_tensor(rec.name)
            assert raw[rec.start : rec.end] == np.ascontiguousarray(array).tobytes()
    assert header.tensors[-1].end == len(raw)


def test_header_is_frozen(st_path: Path) -> None:
    header = parse_safetensors(st_path)
    with pytest.raises(AttributeError):
        header.path = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        header.metadata["format"] = "pt"  # type: ignore[index]


def test_subbyte_and_fp8_dtypes_accepted() -> None:
    header = {
        "a": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]},
        "b": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [4, 7]},
        "c": {"dtype": "F8_E8M0", "shape": [3], "data_offsets": [7, 10]},
        "d": {"dtype": "BF16", "shape": [1], "data_offsets": [10, 12]},
    }
    result = parse(join(header, bytes(12)))
    assert [t.dtype for t in result.tensors] == ["F4", "F6_E2M3", "F8_E8M0", "BF16"]  # type: ignore[attr-defined]


def test_dtype_table_matches_safetensors(tmp_path: Path) -> None:
    for dtype, bits in DTYPE_BITS.items():
        count = 8  # 8 elements is a whole number of bytes for every dtype
        raw = join(
            {"t": {"dtype": dtype, "shape": [count], "data_offsets": [0, count * bits // 8]}},
            bytes(count * bits // 8),
        )
        path = tmp_path / f"{dtype}.safetensors"
        path.write_bytes(raw)
        with safe_open(str(path), "np") as f:  # safetensors accepts it with the same size
            assert list(f.keys()) == ["t"]
        parse(raw)


def test_reads_only_the_header(st_bytes: bytes) -> None:
    reads: list[tuple[int, int]] = []

    class Spy(BytesSource):
        def read(self, offset: int, length: int) -> bytes:
            reads.append((offset, length))
            return super().read(offset, length)

    header = parse_safetensors_source(Spy(st_bytes, NAME))
    assert reads == [(0, 8), (8, header.header_length)]


# --- hostile inputs ---------------------------------------------------------------------------------

Mutation = Callable[[dict[str, object], bytes], bytes]


def _entry(h: dict[str, object], name: str = Q) -> dict[str, object]:
    entry = h[name]
    assert isinstance(entry, dict)
    return entry


def _set(name: str, field: str, value: object) -> Mutation:
    def mutate(h: dict[str, object], data: bytes) -> bytes:
        _entry(h, name)[field] = value
        return join(h, data)

    return mutate


def _by_offset(h: dict[str, object]) -> list[str]:
    """Tensor names with bytes, in data order."""
    names = [k for k in h if k != "__metadata__" and len(set(_entry(h, k)["data_offsets"])) == 2]
    return sorted(names, key=lambda k: _entry(h, k)["data_offsets"])


def _shift_last(delta: int) -> Mutation:
    """Move the last tensor's interval by ``delta``; insert (or keep) bytes so only the layout breaks."""

    def mutate(h: dict[str, object], data: bytes) -> bytes:
        last = _entry(h, _by_offset(h)[-1])
        lo, hi = last["data_offsets"]
        last["data_offsets"] = [lo + delta, hi + delta]
        return join(h, data[:lo] + bytes(max(delta, 0)) + data[lo:])

    return mutate


HOSTILE: list[tuple[str, Mutation, type[ContainerError], str | None]] = [
    ("shorter-than-prefix", lambda h, d: b"\x10\x00\x00", E.TruncatedFileError, None),
    ("length-zero", lambda h, d: struct.pack("<Q", 0) + d, E.HeaderLengthError, None),
    (
        "length-beyond-file",
        lambda h, d: struct.pack("<Q", 10**6) + json.dumps(h).encode() + d,
        E.HeaderLengthError,
        None,
    ),
    ("length-beyond-cap", lambda h, d: struct.pack("<Q", 2**63) + d, E.HeaderTooLargeError, None),
    ("bad-utf8", lambda h, d: join(b'{"\xff\xfe": 1}', d), E.HeaderEncodingError, None),
    ("lone-surrogate-name", lambda h, d: join('{"\\ud800": {}}', d), E.HeaderEncodingError, "\ud800"),
    ("not-json", lambda h, d: join(b"{not json}", d), E.HeaderJSONError, None),
    ("nan", lambda h, d: join(b'{"__metadata__": {"a": NaN}}', d), E.HeaderJSONError, None),
    ("deep-nesting", lambda h, d: join(b"[" * 100_000 + b"]" * 100_000, d), E.HeaderJSONError, None),
    ("huge-int", lambda h, d: join(b'{"t": {"shape": [' + b"9" * 5000 + b"]}}", d), E.HeaderJSONError, None),
    ("non-object", lambda h, d: join(b"[1, 2, 3]", d), E.HeaderNotObjectError, None),
    (
        "duplicate-key",
        lambda h, d: join(json.dumps(h)[:-1] + ', "' + Q + '": ' + json.dumps(h[Q]) + "}", d),
        E.DuplicateKeyError,
        None,
    ),
    ("entry-not-object", lambda h, d: join({**h, Q: [1]}, d), E.TensorEntryError, Q),
    ("unknown-field", _set(Q, "extra", 1), E.TensorEntryError, Q),
    (
        "missing-field",
        lambda h, d: join({**h, Q: {"dtype": "F32", "shape": [3, 5]}}, d),
        E.TensorEntryError,
        Q,
    ),
    ("unknown-dtype", _set(Q, "dtype", "F128"), E.UnknownDtypeError, Q),
    ("dtype-not-string", _set(Q, "dtype", 7), E.UnknownDtypeError, Q),
    ("shape-float", _set(Q, "shape", [3.0, 5]), E.TensorEntryError, Q),
    ("shape-bool", _set(Q, "shape", [True, 15]), E.TensorEntryError, Q),
    ("shape-too-many-dims", _set(Q, "shape", [1] * 65), E.TensorEntryError, Q),
    ("shape-negative", _set(Q, "shape", [-3, -5]), E.ShapeOverflowError, Q),
    ("shape-overflow", _set(Q, "shape", [2**40, 2**40]), E.ShapeOverflowError, Q),
    ("shape-bits-overflow", _set(Q, "shape", [2**31, 2**31]), E.ShapeOverflowError, Q),
    ("size-mismatch", _set(Q, "shape", [3, 4]), E.TensorSizeMismatchError, Q),
    (
        "f4-odd-count",
        lambda h, d: join({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, b"\0"),
        E.TensorSizeMismatchError,
        "t",
    ),
    ("offsets-reversed", _set(Q, "data_offsets", [60, 0]), E.TensorEntryError, Q),
    ("offsets-three", _set(Q, "data_offsets", [0, 30, 60]), E.TensorEntryError, Q),
    ("offsets-beyond-data", _set(Q, "data_offsets", [10**6, 10**6 + 60]), E.TensorOutOfBoundsError, Q),
    ("overlap", _shift_last(-2), E.TensorOverlapError, None),
    ("hole", _shift_last(8), E.TensorGapError, None),
    ("trailing-bytes", lambda h, d: join(h, d + b"\0\0"), E.TrailingBytesError, None),
    ("truncated-data", lambda h, d: join(h, d[:-1]), E.TensorOutOfBoundsError, None),
    ("metadata-int-value", lambda h, d: join({**h, "__metadata__": {"a": 1}}, d), E.MetadataTypeError, None),
    ("metadata-list", lambda h, d: join({**h, "__metadata__": ["a"]}, d), E.MetadataTypeError, None),
    (
        "metadata-nested",
        lambda h, d: join({**h, "__metadata__": {"a": {"b": "c"}}}, d),
        E.MetadataTypeError,
        None,
    ),
]


@pytest.mark.parametrize(("mutate", "err", "tensor"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_safetensors(
    st_bytes: bytes, mutate: Mutation, err: type[ContainerError], tensor: str | None
) -> None:
    header, data = split(st_bytes)
    expect(mutate(header, data), err, tensor)


def test_cap_is_configurable(st_bytes: bytes) -> None:
    exc = expect(st_bytes, E.HeaderTooLargeError, limits=SafetensorsLimits(max_header_bytes=64))
    assert "expected at most 64 bytes" in str(exc) and "max_header_bytes" not in str(exc)


def test_overlap_and_hole_name_the_tensors(st_bytes: bytes) -> None:
    header, data = split(st_bytes)
    *_, before, last = _by_offset(header)
    exc = expect(_shift_last(-2)(header, data), E.TensorOverlapError, last)
    assert repr(before) in str(exc)
    header, data = split(st_bytes)
    expect(_shift_last(8)(header, data), E.TensorGapError, last)


def test_missing_file_is_a_read_error(tmp_path: Path) -> None:
    with pytest.raises(E.ContainerReadError, match=r"nope\.safetensors"):
        parse_safetensors(tmp_path / "nope.safetensors")


def test_errors_pickle() -> None:
    import pickle

    exc = E.TensorOverlapError("f", tensor="t", field="x", expected="1", found="2", remedy="r")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is E.TensorOverlapError and str(back) == str(exc) and back.tensor == "t"
