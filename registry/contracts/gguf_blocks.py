"""Reference decoders for GGUF (ggml) block types, written from the block layouts.

Each block type packs ``block_size`` elements into ``type_size`` bytes; a row of K elements is
``K / block_size`` consecutive blocks. Half-precision fields are IEEE binary16, little-endian. All
arithmetic is binary32 with the evaluation order stated per type; every product below is exact in
binary32 except where a sum follows, so results match ggml's reference dequantization bit for bit.

Layouts (byte offsets within one block):

- ``Q8_0`` (32, 34):   d f16 @0; q int8[32] @2.                              y = d·q
- ``Q4_0`` (32, 18):   d @0; 16 bytes @2, element j<16 low nibble of byte j,
                       j≥16 high nibble of byte j-16.                        y = d·(q - 8)
- ``Q4_1`` (32, 20):   d @0, m @2; nibbles @4 as Q4_0.                       y = d·q + m
- ``Q5_0`` (32, 22):   d @0; qh u32 @2 (bit j = 5th bit of element j); nibbles @6.  y = d·(q - 16)
- ``Q5_1`` (32, 24):   d @0, m @2; qh @4; nibbles @8.                        y = d·q + m
- ``Q4_K`` (256, 144): d @0, dmin @2; 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks @4;
                       128 bytes @16: chunk c of 32 bytes holds sub-block 2c in low nibbles and
                       2c+1 in high nibbles.                                 y = (d·sc)·q - (dmin·m)
- ``Q5_K`` (256, 176): as Q4_K, plus qh[32] @16 (bit s of byte l = 5th bit of lane l of sub-block s);
                       nibbles @48.
- ``Q6_K`` (256, 210): ql[128] @0, qh[64] @128, sc int8[16] @192, d @208. Two halves of 128; in half h,
                       quarter t lane l: low nibble of ql[64h + l + 32·(t mod 2)] (high nibble when
                       t ≥ 2), high two bits ``(qh[32h + l] >> 2t) & 3``.       y = (d·sc)·(q - 32)
- ``F32``/``F16``/``BF16``: one element per ``type_size`` bytes, widened exactly.

The other types ``gguf.quants`` dequantizes are decoded in :mod:`.gguf_lowbit` (Q2_K, Q3_K, TQ1_0,
TQ2_0, MXFP4, NVFP4, IQ4_NL, IQ4_XS) and :mod:`.gguf_iquants` (the grid types IQ1_S ... IQ3_S).
"""

from __future__ import annotations

from typing import get_args

import numpy as np
import numpy.typing as npt

from shardport.registry.formats.elements import ELEMENTS

from . import gguf_iquants, gguf_lowbit
from .errors import PlaneShapeError, PlaneSizeError
from .formats import bf16_bits_to_f32
from .model import GgmlType

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

#: ggml type → (elements per block, bytes per block), for the types this module decodes.
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    name: (ELEMENTS[name].block, ELEMENTS[name].block_bits // 8) for name in get_args(GgmlType)
}


def _half(blocks: U8, offset: int) -> F32:
    """Read the binary16 at ``offset`` of every block as a ``[B, 1]`` binary32 column."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<f2").astype(np.float32)


def _nibbles32(qs: U8) -> npt.NDArray[np.int64]:
    """32 elements from 16 bytes: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int64)


def _fifth_bits(blocks: U8, offset: int) -> npt.NDArray[np.int64]:
    """Bit j of the little-endian u32 at ``offset`` for j in 0..31, as ``[B, 32]``."""
    qh = np.ascontiguousarray(blocks[:, offset : offset + 4]).view("<u4").astype(np.int64)
    return (qh >> np.arange(32, dtype=np.int64)) & 1


def _scale_min_k4(packed: U8) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Unpack the 12-byte 6-bit (scale, min) pairs of the 8 sub-blocks of a Q4_K/Q5_K block."""
    raw = packed.astype(np.int64)
    scale = np.empty((raw.shape[0], 8), dtype=np.int64)
    minimum = np.empty((raw.shape[0], 8), dtype=np.int64)
    for j in range(4):
        scale[:, j] = raw[:, j] & 63
        minimum[:, j] = raw[:, j + 4] & 63
        scale[:, j + 4] = (raw[:, j + 8] & 0x0F) | ((raw[:, j] >> 6) << 4)
        minimum[:, j + 4] = (raw[:, j + 8] >> 4) | ((raw[:, j + 4] >> 6) << 4)
    return scale, minimum


def _f(values: npt.NDArray[np.int64]) -> F32:
    return values.astype(np.float32)


def _decode_k4(blocks: U8, *, five_bit: bool) -> F32:
    """Q4_K / Q5_K: ``(d*sc)*q - (dmin*m)`` per 32-element sub-block."""
    count = blocks.shape[0]
    scale, minimum = _scale_min_k4(blocks[:, 4:16])
    nib_at = 48 if five_bit else 16
    qs = blocks[:, nib_at : nib_at + 128].reshape(count, 4, 1, 32).astype(np.int64)
    q = ((qs >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0x0F).reshape(count, 8, 32)
    if five_bit:
        qh = blocks[:, 16:48].astype(np.int64).reshape(count, 1, 32)
        q = q | (((qh >> np.arange(8).reshape(1, 8, 1)) & 1) << 4)
    d_scale = (_half(blocks, 0) * _f(scale)).reshape(count, 8, 1)
    d_min = (_half(blocks, 2) * _f(minimum)).reshape(count, 8, 1)
    return (d_scale * _f(q) - d_min).reshape(count, 256)


def _decode_q6k(blocks: U8) -> F32:
    """Q6_K: ``(d*sc)*(q - 32)`` per 16-element sub-block."""
    count = blocks.shape[0]
    ql = blocks[:, 0:128].astype(np.int64).reshape(count, 2, 2, 32)
    qh = blocks[:, 128:192].astype(np.int64).reshape(count, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)
    high = (qh >> (2 * np.arange(4).reshape(1, 1, 4, 1))) & 3
    q = (low | (high << 4)).reshape(count, 16, 16) - 32
    sub_scale = _f(blocks[:, 192:208].view(np.int8).astype(np.int64))
    d_scale = (_half(blocks, 208) * sub_scale).reshape(count, 16, 1)
    return (d_scale * _f(q)).reshape(count, 256)


_MORE_DECODERS = {**gguf_lowbit.DECODERS, **gguf_iquants.DECODERS}
#: binary16 super-scale fields (offsets in the block) of every type that has them at fixed offsets.
_HALF_SCALES: dict[str, tuple[int, ...]] = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    **gguf_lowbit.HALF_SCALES,
    **gguf_iquants.HALF_SCALES,
}


def _decode_blocks(ggml_type: str, blocks: U8) -> F32:
    """Decode ``[B, type_size]`` bytes into ``[B, block_size]`` binary32 values."""
    if ggml_type == "F32":
        return np.ascontiguousarray(blocks).view("<f4").astype(np.float32)
    if ggml_type == "F16":
        return np.ascontiguousarray(blocks).view("<f2").astype(np.float32)
    if ggml_type == "BF16":
        return bf16_bits_to_f32(np.ascontiguousarray(blocks).view("<u2"))
    if ggml_type == "Q8_0":
        return _half(blocks, 0) * _f(blocks[:, 2:].view(np.int8).astype(np.int64))
    if ggml_type == "Q4_0":
        return _half(blocks, 0) * _f(_nibbles32(blocks[:, 2:18]) - 8)
    if ggml_type == "Q4_1":
        return (_half(blocks, 0) * _f(_nibbles32(blocks[:, 4:20]))) + _half(blocks, 2)
    if ggml_type == "Q5_0":
        q = _nibbles32(blocks[:, 6:22]) | (_fifth_bits(blocks, 2) << 4)
        return _half(blocks, 0) * _f(q - 16)
    if ggml_type == "Q5_1":
        q = _nibbles32(blocks[:, 8:24]) | (_fifth_bits(blocks, 4) << 4)
        return (_half(blocks, 0) * _f(q)) + _half(blocks, 2)
    if ggml_type in ("Q4_K", "Q5_K"):
        return _decode_k4(blocks, five_bit=ggml_type == "Q5_K")
    if ggml_type == "Q6_K":
        return _decode_q6k(blocks)
    decoder = _MORE_DECODERS.get(ggml_type)
    if decoder is not None:
        return decoder(blocks)
    raise PlaneShapeError("<gguf>", "ggml_type", f"one of {sorted(BLOCK_SIZES)}", ggml_type)


def row_bytes(ggml_type: str, columns: int, tensor: str) -> int:
    """Bytes of one row of ``columns`` elements; K must be a whole number of blocks."""
    block_size, type_size = BLOCK_SIZES[ggml_type]
    if columns % block_size:
        raise PlaneShapeError(
            tensor,
            "K",
            f"a multiple of the {ggml_type} block size {block_size}",
            columns,
            "GGUF rows are whole blocks; the tensor's shape or type is wrong",
        )
    return columns // block_size * type_size


def as_gguf_rows(data: npt.NDArray[np.generic], ggml_type: str, rows: int, columns: int, tensor: str) -> U8:
    """View a GGUF tensor's bytes as ``[rows, row_bytes]``, refusing a truncated or padded tensor."""
    per_row = row_bytes(ggml_type, columns, tensor)
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size != rows * per_row:
        raise PlaneSizeError(
            tensor,
            "bytes",
            f"{rows * per_row} (= {rows} rows * {per_row} bytes of {ggml_type})",
            raw.size,
            "the tensor data is truncated or padded",
        )
    return raw.reshape(rows, per_row)


def decode_gguf_rows(
    ggml_type: str,
    data: npt.NDArray[np.generic],
    rows: int,
    columns: int,
    tensor: str,
    selected: npt.NDArray[np.int64] | None = None,
) -> F32:
    """Decode a GGUF tensor (or only the ``selected`` rows) into binary32 ``[rows, columns]``."""
    table = as_gguf_rows(data, ggml_type, rows, columns, tensor)
    if selected is not None:
        table = table[selected]
    type_size = BLOCK_SIZES[ggml_type][1]
    blocks = np.ascontiguousarray(table).reshape(-1, type_size)
    values = _decode_blocks(ggml_type, blocks)
    return values.reshape(table.shape[0], columns).astype(np.float32, copy=False)


def gguf_block_scales(
    ggml_type: str, data: npt.NDArray[np.generic], rows: int, columns: int, tensor: str
) -> F32:
    """Return every block scale of the tensor as binary32 (the gate wants them all finite).

    The binary16 super-scales (d, and dmin/m where present; IQ1_M's d gathered from its scale
    words); MXFP4's e8m0 and NVFP4's unsigned-e4m3 scales, NaN where the byte is not one a
    quantizer writes (:func:`.gguf_lowbit.mx_scale_values`). Float types have none.
    """
    offsets = _HALF_SCALES.get(ggml_type, ())
    if not offsets and ggml_type not in ("IQ1_M", "MXFP4", "NVFP4"):
        return np.zeros(0, dtype=np.float32)
    blocks = as_gguf_rows(data, ggml_type, rows, columns, tensor).reshape(-1, BLOCK_SIZES[ggml_type][1])
    if ggml_type == "IQ1_M":
        return gguf_iquants.iq1m_scale(blocks).reshape(-1)
    if ggml_type in ("MXFP4", "NVFP4"):
        return gguf_lowbit.mx_scale_values(ggml_type, blocks)
    return np.concatenate([_half(blocks, offset).reshape(-1) for offset in offsets])


SCALE_RULES: dict[str, str] = {
    "MXFP4": "e8m0 scale bytes 0x00..0xFE (0xFF is NaN)",
    "NVFP4": "unsigned e4m3 scale bytes 0x00..0x7E (bit 7 clear; 0x7F is NaN)",
}
"""What the block-scale gate expects of a type, where it is not "finite binary16 d/dmin"."""
