"""Reference decoders for the GGUF grid (codebook) types, written from the block layouts.

The types: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S.

Each group of 8 (IQ1/IQ2) or 4 (IQ3) elements is one row of a fixed grid of small magnitudes; a
sign pattern and a sub-block scale complete the value. The grid *data* are llama.cpp's tables as
``gguf.quants`` ships them (hex strings of packed fields plus the field → value map), unpacked here;
the sign table ``ksigns`` is rebuilt from its rule (7 sign bits, the 8th makes the count even).
Arithmetic is binary32 in the order given, matching ``gguf.quants.dequantize`` bit for bit.

Layouts (256 elements per block; byte offsets; d is binary16 unless said):

- ``IQ2_XXS`` (66): d @0; 8 x (u32 grid bytes, u32 aux) @2. aux bits 7g..7g+6: sign index of group g,
  bits 28..31: scale ls.  y = (d·(0.5 + ls)·0.25)·grid·sign (grid 256 x 8)
- ``IQ2_XS`` (74): d @0; 32 u16 @2 (bits 0..8 grid index, 9..15 sign index); 16 4-bit scales @66
  (nibble i mod 2 of byte i // 2), one per 16 elements; grid 512 x 8.
- ``IQ2_S`` (82): d @0; qs[32] @2 (low 8 bits of the grid index); signs[32] @34 (bit j of byte t:
  element 8t + j); qh[8] @66 (bits 2(t mod 4).. of byte t // 4: index bits 8..9); scales @74 as
  IQ2_XS; grid 1024 x 8.
- ``IQ3_XXS`` (98): d @0; qs[64] @2 (grid 256 x 4); 8 u32 @66 (sign indices and scale as IQ2_XXS).
  y = (d·(0.5 + ls)·0.5)·grid·sign
- ``IQ3_S`` (110): d @0; qs[64] @2; qh[8] @66 (bit t mod 8 of byte t // 8: index bit 8); signs[32]
  @74 as IQ2_S; 8 4-bit scales @106.  y = (d·(1 + 2·s))·grid·sign (grid 512 x 4)
- ``IQ1_S`` (50): d @0; qs[32] @2; 8 u16 qh @34 (bits 3k..3k+2: index bits 8..10 of group 4i + k;
  bits 12..14: scale s; bit 15: delta sign).  y = (d·(2s + 1))·(grid + δ), δ = ∓1/8 (grid 2048 x 8)
- ``IQ1_M`` (56): qs[32] @0; qh[16] @32 (nibble t mod 2 of byte t // 2: index bits 8..10, bit 3 the
  delta sign of group t); 4 u16 @48: 3-bit scales (bits 3k.. of word s // 4 for 16-element run s,
  12 bits each) and, in their top nibbles, the binary16 d.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np
import numpy.typing as npt
from gguf import quants

from .gguf_lowbit import half_field, u16_fields

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]

_DELTA = np.float32(0.125)
_GRID_SOURCES = {
    "IQ2_XXS": quants.IQ2_XXS,
    "IQ2_XS": quants.IQ2_XS,
    "IQ2_S": quants.IQ2_S,
    "IQ3_XXS": quants.IQ3_XXS,
    "IQ3_S": quants.IQ3_S,
    "IQ1_S": quants.IQ1_S,
    "IQ1_M": quants.IQ1_M,
}


@cache
def grid(ggml_type: str) -> F32:
    """The grid of ``ggml_type`` as ``[rows, width]`` binary32, unpacked from gguf's packed table."""
    source = _GRID_SOURCES[ggml_type]
    hex_text = source.grid_hex
    if hex_text is None:
        raise RuntimeError(f"gguf.quants.{ggml_type} ships no grid table")
    packed = np.frombuffer(bytes.fromhex(hex_text.decode("ascii")), dtype=np.uint8).astype(np.int64)
    values = np.asarray(source.grid_map, dtype=np.float32)
    bits = math.ceil(math.log2(len(values)))
    per_byte = 8 // bits
    shifts = np.arange(per_byte) * (8 // per_byte)
    fields = (packed.reshape(-1, 1) >> shifts.reshape(1, -1)) & ((1 << bits) - 1)
    out: F32 = values[fields.reshape(-1)].reshape(source.grid_shape)
    return out


def _ksigns() -> I64:
    index = np.arange(128, dtype=np.int64)
    parity = np.array([bin(i).count("1") & 1 for i in range(128)], dtype=np.int64)
    return index | (parity << 7)


KSIGNS = _ksigns()
"""ggml's ``ksigns_iq2xs``: 7 sign bits and an 8th that makes the number of minus signs even."""


def _signs(bits: I64) -> F32:
    """±1 for each of the 8 bits of ``bits`` (bit j set: element j is negative): ``[..., 8]``."""
    set_ = (bits[..., None] >> np.arange(8)) & 1
    return np.where(set_ == 0, np.float32(1), np.float32(-1)).astype(np.float32)


def _nibble_scales(packed: U8) -> I64:
    """4-bit scales: scale i is nibble i mod 2 of byte i // 2."""
    raw = packed.astype(np.int64)
    i = np.arange(raw.shape[1] * 2)
    out: I64 = (raw[:, i // 2] >> (4 * (i % 2))) & 0x0F
    return out


def _scaled(db: F32, values: F32, signs: F32, count: int) -> F32:
    """``(db · grid) · sign`` with ``db`` broadcast over the groups of each sub-block."""
    return ((db.reshape(*db.shape, 1, 1) * values) * signs).reshape(count, 256)


def decode_iq2xxs(blocks: U8) -> F32:
    """IQ2_XXS: 8 sub-blocks of 4 groups of 8; the aux word holds signs and the scale."""
    count = blocks.shape[0]
    words = np.ascontiguousarray(blocks[:, 2:66]).view("<u4").astype(np.int64).reshape(count, 8, 2)
    db = (half_field(blocks, 0) * (np.float32(0.5) + (words[..., 1] >> 28).astype(np.float32))) * np.float32(
        0.25
    )
    index = blocks[:, 2:66].astype(np.int64).reshape(count, 8, 8)[:, :, 0:4]
    sign_index = (words[..., 1:2] >> (7 * np.arange(4))) & 0x7F
    return _scaled(db, grid("IQ2_XXS")[index], _signs(KSIGNS[sign_index]), count)


def decode_iq2xs(blocks: U8) -> F32:
    """IQ2_XS: 16 sub-blocks of 2 groups of 8; each u16 is a grid index and a sign index."""
    count = blocks.shape[0]
    qs = u16_fields(blocks, 2, 32).reshape(count, 16, 2)
    db = (half_field(blocks, 0) * (np.float32(0.5) + _nibble_scales(blocks[:, 66:74]).astype(np.float32))) * (
        np.float32(0.25)
    )
    return _scaled(db, grid("IQ2_XS")[qs & 511], _signs(KSIGNS[qs >> 9]), count)


def decode_iq2s(blocks: U8) -> F32:
    """IQ2_S: 16 sub-blocks of 2 groups of 8; explicit sign bytes, 10-bit grid indices."""
    count = blocks.shape[0]
    t = np.arange(32)
    qh = blocks[:, 66:74].astype(np.int64)
    index = blocks[:, 2:34].astype(np.int64) | (((qh[:, t // 4] >> (2 * (t % 4))) & 3) << 8)
    db = (half_field(blocks, 0) * (np.float32(0.5) + _nibble_scales(blocks[:, 74:82]).astype(np.float32))) * (
        np.float32(0.25)
    )
    signs = _signs(blocks[:, 34:66].astype(np.int64)).reshape(count, 16, 2, 8)
    return _scaled(db, grid("IQ2_S")[index].reshape(count, 16, 2, 8), signs, count)


def decode_iq3xxs(blocks: U8) -> F32:
    """IQ3_XXS: 8 sub-blocks of 4 groups of 8 (two grid rows of 4 each)."""
    count = blocks.shape[0]
    aux = np.ascontiguousarray(blocks[:, 66:98]).view("<u4").astype(np.int64)
    db = (half_field(blocks, 0) * (np.float32(0.5) + (aux >> 28).astype(np.float32))) * np.float32(0.5)
    values = grid("IQ3_XXS")[blocks[:, 2:66].astype(np.int64)].reshape(count, 8, 4, 8)
    sign_index = (aux[..., None] >> (7 * np.arange(4))) & 0x7F
    return _scaled(db, values, _signs(KSIGNS[sign_index]), count)


def decode_iq3s(blocks: U8) -> F32:
    """IQ3_S: 8 sub-blocks of 4 groups of 8; 9-bit grid indices, explicit sign bytes."""
    count = blocks.shape[0]
    t = np.arange(64)
    qh = blocks[:, 66:74].astype(np.int64)
    index = blocks[:, 2:66].astype(np.int64) | (((qh[:, t // 8] >> (t % 8)) & 1) << 8)
    db = half_field(blocks, 0) * (1 + 2 * _nibble_scales(blocks[:, 106:110])).astype(np.float32)
    values = grid("IQ3_S")[index].reshape(count, 8, 4, 8)
    signs = _signs(blocks[:, 74:106].astype(np.int64)).reshape(count, 8, 4, 8)
    return _scaled(db, values, signs, count)


def _delta(negative: I64) -> F32:
    return np.where(negative == 0, _DELTA, -_DELTA).astype(np.float32)


def decode_iq1s(blocks: U8) -> F32:
    """IQ1_S: 8 sub-blocks of 4 groups of 8; ``(d·(2s + 1))·(grid + δ)``."""
    count = blocks.shape[0]
    qh = u16_fields(blocks, 34, 8)
    t = np.arange(32)
    index = blocks[:, 2:34].astype(np.int64) | (((qh[:, t // 4] >> (3 * (t % 4))) & 7) << 8)
    dl = (half_field(blocks, 0) * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)).reshape(count, 8, 1, 1)
    delta = _delta(qh & 0x8000).reshape(count, 8, 1, 1)
    values = grid("IQ1_S")[index].reshape(count, 8, 4, 8)
    out: F32 = (dl * (values + delta)).reshape(count, 256)
    return out


def iq1m_scale(blocks: U8) -> F32:
    """IQ1_M's binary16 d, gathered from the top nibbles of its four scale words: ``[B, 1]``."""
    sc = u16_fields(blocks, 48, 4)
    bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    return bits.astype(np.uint16).view("<f2").astype(np.float32).reshape(-1, 1)


def decode_iq1m(blocks: U8) -> F32:
    """IQ1_M: 16 runs of 2 groups of 8; ``(d·(2s + 1))·(grid + δ)`` with a δ sign per group."""
    count = blocks.shape[0]
    sc = u16_fields(blocks, 48, 4)
    s = np.arange(16)
    dl = (iq1m_scale(blocks) * (2 * ((sc[:, s // 4] >> (3 * (s % 4))) & 7) + 1).astype(np.float32)).reshape(
        count, 16, 1, 1
    )
    t = np.arange(32)
    nibble = (blocks[:, 32:48].astype(np.int64)[:, t // 2] >> (4 * (t % 2))) & 0x0F
    index = blocks[:, 0:32].astype(np.int64) | ((nibble & 7) << 8)
    delta = _delta(nibble & 8).reshape(count, 16, 2, 1)
    values = grid("IQ1_M")[index].reshape(count, 16, 2, 8)
    out: F32 = (dl * (values + delta)).reshape(count, 256)
    return out


DECODERS: dict[str, Callable[[U8], F32]] = {
    "IQ2_XXS": decode_iq2xxs,
    "IQ2_XS": decode_iq2xs,
    "IQ2_S": decode_iq2s,
    "IQ3_XXS": decode_iq3xxs,
    "IQ3_S": decode_iq3s,
    "IQ1_S": decode_iq1s,
    "IQ1_M": decode_iq1m,
}
"""ggml type → ``[B, type_size]`` bytes to ``[B, 256]`` binary32."""

#: binary16 scale fields (offsets in the block); IQ1_M's d is gathered by :func:`iq1m_scale`.
HALF_SCALES: dict[str, tuple[int, ...]] = {name: (0,) for name in DECODERS if name != "IQ1_M"}
