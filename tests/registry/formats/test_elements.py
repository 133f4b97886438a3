"""The one element-type table: every type the gates accept has one entry, and every other table agrees."""

from __future__ import annotations

import json
import struct
from typing import get_args

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from shardport.loader import rank_load
from shardport.placement import layout
from shardport.registry.checkpoint import analysis
from shardport.registry.contracts import encodings, formats, gguf_blocks, infer
from shardport.registry.contracts.formats import e4m3_bits_to_f32, e5m2_bits_to_f32, scale_to_f32
from shardport.registry.contracts.model import FloatFormat, GgmlType
from shardport.registry.formats import BytesSource, parse_safetensors_source
from shardport.registry.formats.elements import DTYPE_BYTES, ELEMENTS, GGML_BY_ID, SAFETENSORS_DTYPES
from shardport.registry.formats.errors import UnknownDtypeError
from shardport.registry.formats.gguf_gate import GGML_TYPES
from shardport.registry.formats.safetensors_gate import DTYPE_BITS
from shardport.registry.tiles import grid as tiles_grid
from shardport.registry.tiles import splits as tiles_splits


def one_tensor(dtype: str, count: int = 8) -> BytesSource:
    """A safetensors file holding one tensor of ``count`` elements of ``dtype`` (zero bytes)."""
    nbytes = count * DTYPE_BITS.get(dtype, 8) // 8
    header = json.dumps({"t": {"dtype": dtype, "shape": [count], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    return BytesSource(struct.pack("<Q", len(header)) + header + bytes(nbytes), "one.safetensors")


@pytest.mark.parametrize("dtype", SAFETENSORS_DTYPES)
def test_every_dtype_the_safetensors_gate_accepts_has_one_entry(dtype: str) -> None:
    header = parse_safetensors_source(one_tensor(dtype))
    assert header.tensors[0].dtype == dtype
    entry = ELEMENTS[dtype]
    assert entry.name == dtype and entry.safetensors and entry.block == 1
    assert [e.name for e in ELEMENTS.values()].count(dtype) == 1


def test_the_safetensors_gate_knows_exactly_the_tables_dtypes() -> None:
    assert set(DTYPE_BITS) == set(SAFETENSORS_DTYPES) == {e.name for e in ELEMENTS.values() if e.safetensors}
    assert all(DTYPE_BITS[name] == ELEMENTS[name].block_bits for name in DTYPE_BITS)
    for unknown in ("F8_E3M4", "Q4_K", "f32"):  # a GGUF type is not a safetensors dtype
        with pytest.raises(UnknownDtypeError):
            parse_safetensors_source(one_tensor(unknown))


def test_every_ggml_type_the_gguf_gate_accepts_has_one_entry() -> None:
    known = {int(t): t for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    assert set(GGML_TYPES) == set(GGML_BY_ID) == set(known)
    ids = [e.gguf_id for e in ELEMENTS.values() if e.gguf_id is not None]
    assert len(ids) == len(set(ids)) == len(known)
    for type_id, ggml in known.items():
        entry = GGML_BY_ID[type_id]
        assert ELEMENTS[ggml.name] is entry
        assert (entry.block, entry.block_bytes) == GGML_QUANT_SIZES[ggml]
        assert GGML_TYPES[type_id] == (ggml.name, *GGML_QUANT_SIZES[ggml])


def test_sizes_agree_with_numpy_and_names_shared_by_both_containers() -> None:
    for e in ELEMENTS.values():
        if e.numpy is not None:
            view = np.dtype(e.numpy)
            assert e.block == 1 and view.itemsize * 8 == e.block_bits, e
            assert view.byteorder in ("<", "|", "="), e
        if e.block > 1:
            assert e.numpy is None and e.bits is None and e.itemsize is None
    both = {e.name for e in ELEMENTS.values() if e.safetensors and e.gguf_id is not None}
    assert {"F32", "F16", "BF16", "I8", "I16", "I32", "I64", "F64"} <= both
    assert ELEMENTS["F4"].block_bytes is None and ELEMENTS["F6_E2M3"].bits == 6
    assert ELEMENTS["F8_E4M3"].numpy == "u1" and ELEMENTS["BF16"].numpy == "<u2"


def test_derived_tables_agree_with_the_one_table() -> None:
    whole = {e.name: e.itemsize for e in ELEMENTS.values() if e.itemsize is not None}
    assert (
        DTYPE_BYTES == whole
        and encodings.DTYPE_BYTES is DTYPE_BYTES
        and tiles_splits.DTYPE_BYTES is DTYPE_BYTES
    )
    assert {"BOOL", "F8_E5M2", "F8_E4M3", "F8_E8M0", "C64"} <= set(DTYPE_BYTES)
    assert gguf_blocks.BLOCK_SIZES == {
        n: (ELEMENTS[n].block, ELEMENTS[n].block_bytes) for n in get_args(GgmlType)
    }
    assert layout.BLOCK_SIZES is gguf_blocks.BLOCK_SIZES and layout.DTYPE_BYTES is DTYPE_BYTES
    assert all(formats._NUMPY_DTYPE[n] == ELEMENTS[n].numpy for n in formats._NUMPY_DTYPE)
    assert analysis.NUMPY_DTYPES == {e.name: e.numpy for e in ELEMENTS.values() if e.safetensors and e.numpy}
    assert rank_load.NUMPY_DTYPES is analysis.NUMPY_DTYPES
    assert tiles_grid.DTYPE_BITS is DTYPE_BITS and tiles_grid.GGML_TYPES is GGML_TYPES
    assert infer._FLOAT == {
        "F32": "binary32",
        "F16": "binary16",
        "BF16": "bfloat16",
        "F8_E4M3": "e4m3",
        "F8_E5M2": "e5m2",
    }
    assert set(infer._FLOAT.values()) == set(get_args(FloatFormat))
    assert infer._GGUF_TYPES == get_args(GgmlType) == tuple(gguf_blocks.BLOCK_SIZES)


@pytest.mark.parametrize(
    ("fmt", "widen", "torch_dtype"),
    [("e4m3", e4m3_bits_to_f32, torch.float8_e4m3fn), ("e5m2", e5m2_bits_to_f32, torch.float8_e5m2)],
)
def test_f8_widening_is_exact_for_every_bit_pattern(
    fmt: str, widen: object, torch_dtype: torch.dtype
) -> None:
    bits = np.arange(256, dtype=np.uint8)
    want = torch.from_numpy(bits).view(torch_dtype).to(torch.float32).numpy()
    for got in (widen(bits), scale_to_f32(bits, fmt, "t")):  # type: ignore[operator]
        assert got.dtype == np.float32
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
        assert np.array_equal(np.signbit(got[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))
