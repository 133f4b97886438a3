"""Reference decoders for the GGUF block types with scalar codes beyond the classic eleven.

Written from the block layouts (byte offsets within one block); binary16 fields are little-endian
IEEE half precision. Arithmetic is binary32 in the evaluation order given, so results match
``gguf.quants.dequantize`` (and ggml's reference dequantization) bit for bit.

"2-bit crumbs" of ``C`` 32-byte chunks: element ``128c + 32s + l`` is bits ``2s..2s+1`` of byte
``32c + l``. "Nibbles" of 16 bytes: elements 0..15 are the low nibbles, 16..31 the high ones.

- ``Q2_K`` (256, 84): sc[16] @0 (low nibble scale, high nibble min of each 16-element sub-block);
  crumbs of qs[64] @16; d @80, dmin @82.                         y = (d·sc)·q - (dmin·m)
- ``Q3_K`` (256, 110): hmask[32] @0 (bit b of byte l is the high bit of element 32b + l); crumbs of
  qs[64] @32; 16 6-bit scales @96 (low nibbles in bytes 0..7, element i in nibble i // 8 of byte
  i mod 8; high 2 bits in bytes 8..11, bits 2(i // 4) of byte 8 + i mod 4), biased by 32; d @108.
                                                                 y = (d·sc)·(q - 4·(1 - hbit))
- ``TQ1_0`` (256, 54): qs[48] @0, qh[4] @48 (ternary digits: digit k of byte b is
  ``((b·3^k mod 256)·3) >> 8``; elements: digit k of qs[l<32] at 32k + l, of qs[32 + l] at
  160 + 16k + l, of qh[l] at 240 + 4k + l); d @52.               y = d·(t - 1)
- ``TQ2_0`` (256, 66): crumbs of qs[64] @0; d @64.                y = d·(q - 1)
- ``MXFP4`` (32, 17): e8m0 exponent @0; nibbles @1 index the doubled e2m1 values.
                                                                 y = 2^(e-128)·v
- ``NVFP4`` (64, 36): 4 unsigned-e4m3 scales @0 (one per 16 elements, halved; 0x00 and 0x7F read as 0);
  qs[32] @4: 8 bytes per sub-block, low nibbles elements 0..7, high 8..15.  y = (s/2)·v
- ``IQ4_NL`` (32, 18): d @0; nibbles @2 index the IQ4 non-linear table.   y = d·kv
- ``IQ4_XS`` (256, 136): d @0; scales_h u16 @2 (bits 2i..2i+1: high bits of scale i); scales_l[4] @4
  (nibble i mod 2 of byte i // 2); 8 x 16-byte nibble runs @8; scales biased by 32.  y = (d·sc)·kv
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
I16 = npt.NDArray[np.int16]
I64 = npt.NDArray[np.int64]

#: e2m1 values doubled (ggml's ``kvalues_mxfp4``), indexed by the 4-bit code.
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
#: IQ4_NL / IQ4_XS non-linear levels (ggml's ``kvalues_iq4nl``).
IQ4_LEVELS = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32
)
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.int64)
#: NVFP4's 0x7F: the e4m3 NaN pattern, read as 0 by ggml; a quantizer never writes it.
UE4M3_NAN = 0x7F


def half_field(blocks: U8, offset: int) -> F32:
    """The binary16 at ``offset`` of every block as a ``[B, 1]`` binary32 column."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<f2").astype(np.float32)


def u16_fields(blocks: U8, start: int, count: int) -> I64:
    """``count`` little-endian u16 words from ``start`` of every block, as ``[B, count]``."""
    raw = np.ascontiguousarray(blocks[:, start : start + 2 * count]).view("<u2")
    return raw.astype(np.int64)


_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)


def _f(values: npt.NDArray[np.integer[Any]]) -> F32:
    return values.astype(np.float32)


def nibbles(qs: U8) -> I16:
    """Low nibbles then high nibbles of each row of bytes: ``[B, n]`` → ``[B, 2n]``."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int16)


def crumbs(qs: U8) -> I16:
    """2-bit fields of 32-byte chunks: element 128c + 32s + l is bits 2s.. of byte 32c + l."""
    count, width = qs.shape
    raw = qs.reshape(count, width // 32, 1, 32)
    return ((raw >> _CRUMB_SHIFTS) & 3).reshape(count, width * 4).astype(np.int16)


def decode_q2k(blocks: U8) -> F32:
    """Q2_K: ``(d·sc)·q - (dmin·m)`` per 16-element sub-block."""
    count = blocks.shape[0]
    sc = blocks[:, 0:16].astype(np.int64)
    q = _f(crumbs(blocks[:, 16:80])).reshape(count, 16, 16)
    dl = (half_field(blocks, 80) * _f(sc & 0x0F)).reshape(count, 16, 1)
    ml = (half_field(blocks, 82) * _f(sc >> 4)).reshape(count, 16, 1)
    return (dl * q - ml).reshape(count, 256)


def q3k_scales(packed: U8) -> I64:
    """The 16 signed sub-block scales of a Q3_K block from its 12 scale bytes."""
    raw = packed.astype(np.int64)
    i = np.arange(16)
    low = (raw[:, i % 8] >> (4 * (i // 8))) & 0x0F
    high = (raw[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    return (low | (high << 4)) - 32


def decode_q3k(blocks: U8) -> F32:
    """Q3_K: ``(d·sc)·(q - 4·(1 - hbit))`` per 16-element sub-block."""
    count = blocks.shape[0]
    high = ((blocks[:, 0:32].reshape(count, 1, 32) >> _BIT_SHIFTS) & 1).reshape(count, 256)
    q = crumbs(blocks[:, 32:96]) - 4 * (1 - high.astype(np.int16))
    dl = (half_field(blocks, 108) * _f(q3k_scales(blocks[:, 96:108]))).reshape(count, 16, 1)
    return (dl * _f(q).reshape(count, 16, 16)).reshape(count, 256)


def _trits(packed: U8, digits: int) -> I64:
    """Ternary digits - 1 of ``[B, n]`` bytes: digit k of byte l at ``k·n + l``."""
    count, width = packed.shape
    scaled = (packed.astype(np.int64).reshape(count, 1, width) * _POW3[:digits].reshape(1, digits, 1)) & 0xFF
    return ((scaled * 3) >> 8).reshape(count, digits * width) - 1


def tq1_levels(blocks: U8) -> I64:
    """The 256 levels t in {-1, 0, 1} of TQ1_0 blocks (five to a byte in base 3, four in qh)."""
    return np.concatenate(
        [_trits(blocks[:, 0:32], 5), _trits(blocks[:, 32:48], 5), _trits(blocks[:, 48:52], 4)], axis=1
    )


def decode_tq1(blocks: U8) -> F32:
    """TQ1_0: ``d·t``."""
    return half_field(blocks, 52) * _f(tq1_levels(blocks))


def decode_tq2(blocks: U8) -> F32:
    """TQ2_0: ``d·(q - 1)`` with 2-bit q."""
    return half_field(blocks, 64) * _f(crumbs(blocks[:, 0:64]) - 1)


def e8m0_half(exponents: U8) -> F32:
    """``2^(e - 128)`` (half the e8m0 scale) as binary32, subnormal for e < 2 (ggml's rule)."""
    e = exponents.astype(np.int64)
    bits = np.where(e < 2, 0x00200000 << np.minimum(e, 1), (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def decode_mxfp4(blocks: U8) -> F32:
    """MXFP4: ``2^(e-128) · v`` with v the doubled e2m1 value of each nibble."""
    return e8m0_half(blocks[:, 0:1]) * E2M1_DOUBLED[nibbles(blocks[:, 1:17])]


def _ue4m3_half_table() -> F32:
    """Half the value of every unsigned-e4m3 byte (bit 7 ignored; 0x00 and 0x7F are 0)."""
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0x0F, (codes & 7).astype(np.float64)
    value = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = np.where((codes == 0) | (codes == UE4M3_NAN), 0.0, value * 0.5)
    return value.astype(np.float32)  # every value is exact in binary32


UE4M3_HALF = _ue4m3_half_table()


def decode_nvfp4(blocks: U8) -> F32:
    """NVFP4: ``(s/2) · v`` per 16-element sub-block, s unsigned e4m3."""
    count = blocks.shape[0]
    scale = UE4M3_HALF[blocks[:, 0:4]].reshape(count, 4, 1)
    qs = blocks[:, 4:36].astype(np.int64).reshape(count, 4, 8)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    out: F32 = (scale * E2M1_DOUBLED[codes]).reshape(count, 64)
    return out


def decode_iq4nl(blocks: U8) -> F32:
    """IQ4_NL: ``d · kv[q]``."""
    return half_field(blocks, 0) * IQ4_LEVELS[nibbles(blocks[:, 2:18])]


def iq4xs_scales(blocks: U8) -> I64:
    """The 8 signed 6-bit sub-block scales of IQ4_XS blocks."""
    high = u16_fields(blocks, 2, 1)
    low = blocks[:, 4:8].astype(np.int64)
    i = np.arange(8)
    return (((low[:, i // 2] >> (4 * (i % 2))) & 0x0F) | (((high >> (2 * i)) & 3) << 4)) - 32


def decode_iq4xs(blocks: U8) -> F32:
    """IQ4_XS: ``(d·sc) · kv[q]`` per 32-element sub-block."""
    count = blocks.shape[0]
    dl = (half_field(blocks, 0) * _f(iq4xs_scales(blocks))).reshape(count, 8, 1)
    qs = blocks[:, 8:136].astype(np.int64).reshape(count, 8, 16)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    out: F32 = (dl * IQ4_LEVELS[codes]).reshape(count, 256)
    return out


DECODERS: dict[str, Callable[[U8], F32]] = {
    "Q2_K": decode_q2k,
    "Q3_K": decode_q3k,
    "TQ1_0": decode_tq1,
    "TQ2_0": decode_tq2,
    "MXFP4": decode_mxfp4,
    "NVFP4": decode_nvfp4,
    "IQ4_NL": decode_iq4nl,
    "IQ4_XS": decode_iq4xs,
}
"""ggml type → ``[B, type_size]`` bytes to ``[B, block_size]`` binary32."""

#: binary16 scale fields (offsets in the block) of the types above that have them.
HALF_SCALES: dict[str, tuple[int, ...]] = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def mx_scale_values(ggml_type: str, blocks: U8) -> F32:
    """MXFP4 / NVFP4 block scales as binary32, NaN where the byte is not a scale a quantizer writes.

    MXFP4: e8m0 0xFF is NaN (OCP MX). NVFP4: the scales are unsigned e4m3: bit 7 set, or 0x7F
    (the e4m3 NaN), is refused.
    """
    if ggml_type == "MXFP4":
        raw = blocks[:, 0]
        return np.where(raw == 0xFF, np.float32(np.nan), e8m0_half(raw)).astype(np.float32)
    raw = blocks[:, 0:4].reshape(-1)
    bad = (raw >= 0x80) | (raw == UE4M3_NAN)
    return np.where(bad, np.float32(np.nan), UE4M3_HALF[raw]).astype(np.float32)
