"""Property tests: the gates are total (a result or a ContainerError, never anything else) and bounded
(they never request more bytes than their cap), on arbitrary bytes and on mutations of valid files."""

from __future__ import annotations

import json
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from shardport.registry.formats import (
    BytesSource,
    ContainerError,
    GGUFLimits,
    SafetensorsLimits,
    parse_gguf_source,
    parse_safetensors_source,
)
from shardport.registry.formats.safetensors_gate import DTYPE_BITS

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class CountingSource(BytesSource):
    """A source that records every read request."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, "fuzz.bin")
        self.requested = 0
        self.calls = 0

    def read(self, offset: int, length: int) -> bytes:
        assert offset >= 0 and length >= 0
        assert offset + length <= self.size  # the gates never ask beyond the end
        self.requested += length
        self.calls += 1
        return super().read(offset, length)


def total_st(raw: bytes, limits: SafetensorsLimits | None = None) -> CountingSource:
    source = CountingSource(raw)
    try:
        parse_safetensors_source(source, limits)
    except ContainerError:
        pass
    return source


def total_gguf(raw: bytes, limits: GGUFLimits | None = None) -> CountingSource:
    source = CountingSource(raw)
    try:
        parse_gguf_source(source, limits)
    except ContainerError:
        pass
    return source


mutations = st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6)


def mutate(raw: bytes, flips: list[tuple[int, int]], end: int | None = None) -> bytes:
    out = bytearray(raw)
    limit = min(end or len(out), len(out))
    for pos, byte in flips:
        out[pos % limit] = byte
    return bytes(out)


# --- safetensors ------------------------------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.sampled_from([*DTYPE_BITS, "F128", ""]),
    st.text(max_size=4),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "x"]), inner, max_size=4),
    ),
    max_leaves=12,
)
_entries = st.dictionaries(st.sampled_from(["a", "b", "__metadata__", "c"]), _json, max_size=3)


@FAST
@given(st.binary(max_size=200))
def test_st_arbitrary_bytes(raw: bytes) -> None:
    total_st(raw)


@FAST
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_st_arbitrary_header(header: bytes, data: bytes) -> None:
    total_st(struct.pack("<Q", len(header)) + header + data)


@FAST
@given(_entries, st.integers(0, 64))
def test_st_json_shaped_headers(entries: dict[str, object], data_len: int) -> None:
    text = json.dumps(entries).encode()
    total_st(struct.pack("<Q", len(text)) + text + bytes(data_len))


@FAST
@given(mutations, st.integers(0, 8))
def test_st_mutated_valid(st_bytes: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    raw = mutate(st_bytes, flips)
    total_st(raw[: len(raw) - cut])


@FAST
@given(mutations, st.integers(0, 4096))
def test_st_reads_are_bounded_by_the_cap(st_bytes: bytes, flips: list[tuple[int, int]], cap: int) -> None:
    source = total_st(mutate(st_bytes, flips, end=8), SafetensorsLimits(max_header_bytes=cap))
    assert source.requested <= 8 + cap
    assert source.calls <= 2


_arrays = st.dictionaries(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=8).filter(lambda s: s != "__metadata__"),
    st.tuples(
        st.sampled_from(["float16", "float32", "int8", "uint16", "int64", "bool"]),
        st.lists(st.integers(0, 3), max_size=3),
    ),
    max_size=5,
)


@FAST
@given(_arrays)
def test_st_roundtrip_agrees_with_writer(spec: dict[str, tuple[str, list[int]]]) -> None:
    arrays = {
        k: np.arange(int(np.prod(s)), dtype=np.int64).astype(dt).reshape(s) for k, (dt, s) in spec.items()
    }
    raw = save(arrays)
    header = parse_safetensors_source(BytesSource(raw, "rt.safetensors"))
    assert {t.name for t in header.tensors} == set(arrays)
    for rec in header.tensors:
        assert rec.shape == arrays[rec.name].shape
        assert raw[rec.start : rec.end] == arrays[rec.name].tobytes()


# --- GGUF -------------------------------------------------------------------------------------------

_gguf_prefix = st.sampled_from([b"GGUF\x03\x00\x00\x00", b"GGUF\x02\x00\x00\x00"])


@FAST
@given(st.binary(max_size=200))
def test_gguf_arbitrary_bytes(raw: bytes) -> None:
    total_gguf(raw)


@FAST
@given(_gguf_prefix, st.binary(max_size=300))
def test_gguf_arbitrary_body(prefix: bytes, body: bytes) -> None:
    total_gguf(prefix + body)


@FAST
@given(_gguf_prefix, st.integers(0, 40), st.integers(0, 40), st.binary(max_size=300))
def test_gguf_small_counts_arbitrary_entries(prefix: bytes, n_t: int, n_kv: int, body: bytes) -> None:
    total_gguf(prefix + struct.pack("<QQ", n_t, n_kv) + body)


@FAST
@given(mutations, st.integers(0, 64))
def test_gguf_mutated_valid(gguf_bytes: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    raw = mutate(gguf_bytes, flips, end=2600)  # the header region of the fixture
    total_gguf(raw[: len(raw) - cut])


@FAST
@given(mutations, st.integers(0, 4096))
def test_gguf_reads_are_bounded_by_the_cap(gguf_bytes: bytes, flips: list[tuple[int, int]], cap: int) -> None:
    source = total_gguf(mutate(gguf_bytes, flips, end=2600), GGUFLimits(max_header_bytes=cap))
    assert source.requested <= cap


@st.composite
def _tensor_entries(draw: st.DrawFn) -> dict[str, object]:
    """A valid tensor entry, then (usually) one perturbation of one field."""
    dtype = draw(st.sampled_from(list(DTYPE_BITS)))
    shape: list[object] = draw(st.lists(st.integers(0, 6), max_size=4))
    count = int(np.prod(shape)) if shape else 1
    if count * DTYPE_BITS[dtype] % 8:
        shape = [*shape, 8]
        count *= 8
    begin = draw(st.sampled_from([0, 7]))
    entry: dict[str, object] = {
        "dtype": dtype,
        "shape": shape,
        "data_offsets": [begin, begin + count * DTYPE_BITS[dtype] // 8],
    }
    field = draw(st.sampled_from(["none", "dtype", "shape", "dim", "offsets", "begin", "extra"]))
    bad = draw(st.sampled_from([-1, 1, 2**62, 2**63, True, 1.0, "F128", None, [1], 3]))
    if field == "extra":
        entry["x"] = bad
    elif field == "dim":
        entry["shape"] = [*shape, bad]
    elif field == "offsets":
        entry["data_offsets"] = [begin, bad] if bad != 1 else [begin, begin + count + 1]
    elif field == "begin":
        entry["data_offsets"] = [bad, entry["data_offsets"][1]]  # type: ignore[index]
    elif field != "none":
        entry[field] = bad
    return entry


@settings(max_examples=400, deadline=None)
@given(_tensor_entries())
def test_st_fast_path_accepts_exactly_what_the_checked_path_accepts(entry: dict[str, object]) -> None:
    from shardport.registry.formats.notes import Notes
    from shardport.registry.formats.safetensors_gate import _accept_tensor, _check_tensor

    fast = _accept_tensor("t", entry, 100, 64)
    try:  # a strict collector: an unknown field refuses there, as it does on the fast path
        slow = _check_tensor("f", "t", entry, 100, SafetensorsLimits(), Notes(strict=True))
    except ContainerError:
        slow = None
    assert fast == slow
