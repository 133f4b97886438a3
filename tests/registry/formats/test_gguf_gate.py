"""The GGUF gate: agreement with gguf.GGUFReader on valid files, one named error per hostile input.

Hostile files are the valid file written by ``gguf.GGUFWriter`` with one field patched; the field
positions come from ``GGUFReader`` on the valid file (trustworthy there), never from the gate.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from shardport.registry.formats import BytesSource, ContainerError, GGUFArray, GGUFLimits, parse_gguf
from shardport.registry.formats import errors as E
from shardport.registry.formats.gguf_gate import GGML_TYPES, parse_gguf_source

NAME = "hostile.gguf"
Q4 = "blk.0.attn_q.weight"
K, L, NORM = "blk.0.attn_k.weight", "blk.0.attn_l.weight", "output_norm.weight"


class Layout:
    """Byte positions of fields of the valid file, read with gguf-py."""

    def __init__(self, path: Path) -> None:
        self.reader = gguf.GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}

    def kv(self, key: str, part: int) -> int:
        field = self.reader.fields[key]
        return int(field.offset) + sum(p.nbytes for p in field.parts[:part])

    def tensor(self, name: str, part: int) -> int:
        field = self.tensors[name].field
        return int(field.offset) + sum(p.nbytes for p in field.parts[:part])

    def rel_offset(self, name: str) -> int:
        return int(self.tensors[name].data_offset) - int(self.reader.data_offset)


def patch(raw: bytes, pos: int, fmt: str, value: object) -> bytes:
    out = bytearray(raw)
    struct.pack_into("<" + fmt, out, pos, value)
    return bytes(out)


def parse(raw: bytes, limits: GGUFLimits | None = None) -> object:
    return parse_gguf_source(BytesSource(raw, NAME), limits)


# KV parts: [key length, key, type, value...]; array value parts: [item type, length, items...]
# tensor info parts: [name length, name, n_dims, dims, type, offset]
Case = tuple[str, Callable[[bytes, Layout], bytes], type[ContainerError], "str | None", "GGUFLimits | None"]
HOSTILE: list[Case] = [
    ("bad-magic", lambda r, lay: b"GGUX" + r[4:], E.BadMagicError, None, None),
    ("empty-file", lambda r, lay: b"", E.TruncatedFileError, None, None),
    ("version-1", lambda r, lay: patch(r, 4, "I", 1), E.UnsupportedVersionError, None, None),
    ("version-4", lambda r, lay: patch(r, 4, "I", 4), E.UnsupportedVersionError, None, None),
    ("absurd-tensor-count", lambda r, lay: patch(r, 8, "Q", 2**62), E.CountLimitError, None, None),
    ("absurd-kv-count", lambda r, lay: patch(r, 16, "Q", 10**9), E.CountLimitError, None, None),
    ("tensor-count-cap", lambda r, lay: r, E.CountLimitError, None, GGUFLimits(max_tensor_count=4)),
    ("kv-count-cap", lambda r, lay: r, E.CountLimitError, None, GGUFLimits(max_kv_count=3)),
    ("header-cap", lambda r, lay: r, E.HeaderTooLargeError, None, GGUFLimits(max_header_bytes=1024)),
    ("truncated-header", lambda r, lay: r[: lay.tensor(Q4, 3) + 4], E.TruncatedFileError, None, None),
    (
        "string-beyond-file",
        lambda r, lay: patch(r, lay.kv("general.name", 3), "Q", 2**40),
        E.StringLengthError,
        None,
        None,
    ),
    ("string-beyond-cap", lambda r, lay: r, E.StringLengthError, None, GGUFLimits(max_string_bytes=3)),
    (
        "key-beyond-file",
        lambda r, lay: patch(r, lay.kv("general.name", 0), "Q", 2**63),
        E.StringLengthError,
        None,
        None,
    ),
    (
        "key-not-utf8",
        lambda r, lay: patch(r, lay.kv("general.name", 1), "B", 0xFF),
        E.HeaderEncodingError,
        None,
        None,
    ),
    (
        "duplicate-key",
        lambda r, lay: patch(r, lay.kv("general.namf", 1) + 11, "B", ord("e")),
        E.DuplicateKeyError,
        None,
        None,
    ),
    (
        "unknown-value-type",
        lambda r, lay: patch(r, lay.kv("llama.block_count", 2), "I", 13),
        E.ValueTypeError,
        None,
        None,
    ),
    (
        "unknown-array-item-type",
        lambda r, lay: patch(r, lay.kv("llama.small_ints", 3), "I", 99),
        E.ValueTypeError,
        None,
        None,
    ),
    (
        "array-nested-too-deep",
        lambda r, lay: patch(r, lay.kv("llama.small_ints", 3), "I", 9),
        E.ValueTypeError,
        None,
        GGUFLimits(max_array_depth=1),
    ),
    (
        "array-beyond-file",
        lambda r, lay: patch(r, lay.kv("tokenizer.ggml.tokens", 4), "Q", 2**61),
        E.ArrayLengthError,
        None,
        None,
    ),
    (
        "numeric-array-beyond-file",
        lambda r, lay: patch(r, lay.kv("tokenizer.ggml.scores", 4), "Q", 2**40),
        E.ArrayLengthError,
        None,
        None,
    ),
    (
        "token-string-beyond-file",
        lambda r, lay: patch(r, lay.kv("tokenizer.ggml.tokens", 5), "Q", 2**40),
        E.StringLengthError,
        None,
        None,
    ),
    (
        "bool-not-0-or-1",
        lambda r, lay: patch(r, lay.kv("tokenizer.ggml.add_bos_token", 3), "B", 2),
        E.ValueTypeError,
        None,
        None,
    ),
    (
        "alignment-not-power-of-two",
        lambda r, lay: patch(r, lay.kv("general.alignment", 3), "I", 48),
        E.AlignmentError,
        None,
        None,
    ),
    (
        "alignment-zero",
        lambda r, lay: patch(r, lay.kv("general.alignment", 3), "I", 0),
        E.AlignmentError,
        None,
        None,
    ),
    (
        "alignment-wrong-type",
        lambda r, lay: patch(r, lay.kv("general.alignment", 2), "I", 5),
        E.AlignmentError,
        None,
        None,
    ),
    ("tensor-name-cap", lambda r, lay: r, E.StringLengthError, None, GGUFLimits(max_tensor_name_bytes=8)),
    ("n-dims-5", lambda r, lay: patch(r, lay.tensor(Q4, 2), "I", 5), E.DimensionError, Q4, None),
    (
        "dims-overflow",
        lambda r, lay: patch(r, lay.tensor(NORM, 3), "Q", 2**63),
        E.ShapeOverflowError,
        NORM,
        None,
    ),
    (
        "dims-product-overflow",
        lambda r, lay: patch(patch(r, lay.tensor(Q4, 3), "Q", 2**40), lay.tensor(Q4, 3) + 8, "Q", 2**40),
        E.ShapeOverflowError,
        Q4,
        None,
    ),
    (
        "unknown-ggml-type-removed",
        lambda r, lay: patch(r, lay.tensor(Q4, 4), "I", 4),
        E.UnknownGGMLTypeError,
        Q4,
        None,
    ),
    (
        "unknown-ggml-type-large",
        lambda r, lay: patch(r, lay.tensor(Q4, 4), "I", 2**31),
        E.UnknownGGMLTypeError,
        Q4,
        None,
    ),
    (
        "ne0-not-block-multiple",
        lambda r, lay: patch(r, lay.tensor(Q4, 3), "Q", 48),
        E.BlockSizeError,
        Q4,
        None,
    ),
    (
        "misaligned-offset",
        lambda r, lay: patch(r, lay.tensor(K, 5), "Q", lay.rel_offset(K) + 1),
        E.MisalignedTensorError,
        K,
        None,
    ),
    (
        "overlap",
        lambda r, lay: patch(r, lay.tensor(K, 5), "Q", lay.rel_offset(Q4)),
        E.TensorOverlapError,
        None,
        None,
    ),
    (
        "extent-beyond-file",
        lambda r, lay: patch(r, lay.tensor(NORM, 5), "Q", lay.rel_offset(NORM) + 1024),
        E.TensorOutOfBoundsError,
        NORM,
        None,
    ),
    ("truncated-data", lambda r, lay: r[:-200], E.TensorOutOfBoundsError, NORM, None),
    (
        "offsets-out-of-order",
        lambda r, lay: patch(
            patch(r, lay.tensor(K, 5), "Q", lay.rel_offset(L)), lay.tensor(L, 5), "Q", lay.rel_offset(K)
        ),
        E.TensorLayoutError,
        K,
        None,
    ),
    (
        "duplicate-tensor-name",
        lambda r, lay: patch(r, lay.tensor(L, 1) + len("blk.0.attn_"), "B", ord("k")),
        E.DuplicateKeyError,
        K,
        None,
    ),
]


@pytest.fixture(scope="module")
def layout(gguf_path: Path) -> Layout:
    return Layout(gguf_path)


@pytest.mark.parametrize(
    ("mutate", "err", "tensor", "limits"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_gguf(
    gguf_bytes: bytes,
    layout: Layout,
    mutate: Callable[[bytes, Layout], bytes],
    err: type[ContainerError],
    tensor: str | None,
    limits: GGUFLimits | None,
) -> None:
    with pytest.raises(err) as info:
        parse(mutate(gguf_bytes, layout), limits)
    exc = info.value
    assert NAME in str(exc)
    assert exc.exit_code == 5
    if tensor is not None:
        assert exc.tensor == tensor and repr(tensor) in str(exc)


def test_overlap_names_both_tensors(gguf_bytes: bytes, layout: Layout) -> None:
    raw = patch(gguf_bytes, layout.tensor(K, 5), "Q", layout.rel_offset(Q4))
    with pytest.raises(E.TensorOverlapError) as info:
        parse(raw)
    assert {info.value.tensor, *[t for t in (Q4, K) if repr(t) in str(info.value)]} == {Q4, K}


def test_unknown_type_is_reported_by_number(gguf_bytes: bytes, layout: Layout) -> None:
    with pytest.raises(E.UnknownGGMLTypeError, match="type number 4"):
        parse(patch(gguf_bytes, layout.tensor(Q4, 4), "I", 4))


def test_big_endian_is_refused_by_name(tmp_path: Path, make_gguf: Callable[..., Path]) -> None:
    path = make_gguf(tmp_path / "be.gguf", endian=gguf.GGUFEndian.BIG)
    with pytest.raises(E.UnsupportedVersionError, match="big-endian"):
        parse_gguf(path)


def _agree(path: Path) -> None:
    header = parse_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert header.data_offset == reader.data_offset
    assert header.file_size == path.stat().st_size
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for rec, t in zip(header.tensors, reader.tensors, strict=True):
        assert rec.ggml_type == t.tensor_type.name and rec.ggml_type_id == int(t.tensor_type)
        assert list(rec.dims) == [int(d) for d in t.shape]
        assert rec.shape == tuple(reversed(rec.dims))
        assert rec.start == t.data_offset and rec.nbytes == t.n_bytes
        assert rec.start % header.alignment == 0
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.kv) == list(fields)
    for key, field in fields.items():
        value, contents = header.kv[key], field.contents()
        assert header.kv_types[key] == field.types[0].name
        if isinstance(value, GGUFArray):
            assert value.length == len(contents) and value.item_type == field.types[1].name
            if value.values is not None:
                assert list(value.values) == contents
        elif isinstance(value, float):
            assert value == pytest.approx(contents)
        else:
            assert value == contents


def test_agrees_with_gguf_reader(gguf_path: Path) -> None:
    _agree(gguf_path)
    assert parse_gguf(gguf_path).alignment == 64


def test_default_alignment(tmp_path: Path, make_gguf: Callable[..., Path]) -> None:
    path = make_gguf(tmp_path / "a32.gguf", alignment=None)
    _agree(path)
    header = parse_gguf(path)
    assert header.alignment == 32 and "general.alignment" not in header.kv


def test_long_arrays_keep_only_length(gguf_path: Path) -> None:
    kv = parse_gguf(gguf_path).kv
    tokens, small = kv["tokenizer.ggml.tokens"], kv["llama.small_ints"]
    assert isinstance(tokens, GGUFArray) and tokens.values is None and tokens.length == 100
    assert isinstance(small, GGUFArray) and small.values == (1, 2, 3)
    kept = parse_gguf(gguf_path, GGUFLimits(max_kept_array_len=1000)).kv["tokenizer.ggml.tokens"]
    assert isinstance(kept, GGUFArray) and kept.values == tuple(f"tok{i}" for i in range(100))


def test_lenient_layout_accepts_reordered_offsets(gguf_bytes: bytes, layout: Layout) -> None:
    raw = patch(
        patch(gguf_bytes, layout.tensor(K, 5), "Q", layout.rel_offset(L)),
        layout.tensor(L, 5),
        "Q",
        layout.rel_offset(K),
    )
    header = parse_gguf_source(BytesSource(raw, NAME), GGUFLimits(strict_layout=False))
    by_name = header.tensor_map()
    assert by_name[K].start > by_name[L].start


def test_type_table_comes_from_gguf() -> None:
    assert GGML_TYPES[int(gguf.GGMLQuantizationType.Q4_0)] == ("Q4_0", 32, 18)
    assert GGML_TYPES[int(gguf.GGMLQuantizationType.Q8_0)] == ("Q8_0", 32, 34)
    assert 4 not in GGML_TYPES  # Q4_2, removed from ggml


def test_nested_arrays_agree_with_reader(tmp_path: Path) -> None:
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("x.nested", [[1, 2], [3, 4, 5]])
    w.add_array("x.strings", [["a", "b"], ["c"]])
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    header = parse_gguf(path)
    reader = gguf.GGUFReader(str(path))
    for key in ("x.nested", "x.strings"):
        value = header.kv[key]
        assert isinstance(value, GGUFArray) and value.values is not None
        flat = [v for inner in value.values if isinstance(inner, GGUFArray) for v in inner.values or ()]
        assert flat == reader.fields[key].contents()
    with pytest.raises(E.ValueTypeError, match="nested at most 1"):
        parse_gguf(path, GGUFLimits(max_array_depth=1))
