"""Rounding terms of the newer GGUF block types, for the honest bound of :mod:`.rounding`.

Per element of ``[B, block]``: the signed step, the level (decoded value / step), the additive offset
and whether the code is the lowest / highest of its range (a clipped float lies beyond it).

- Q2_K, Q3_K, TQ1_0, TQ2_0 are uniform: step ``d·sc`` (``d`` for the ternary types), level the code
  (Q3_K's ``q - 4·(1 - hbit)``), Q2_K's offset ``dmin·m``.
- IQ4_NL, IQ4_XS, MXFP4, NVFP4 pick each code from a non-uniform table of 16 levels: round to nearest
  is within half the gap to the neighbouring level on the side of the error, so the step is the
  scale times the larger of the two gaps around the code (the one gap at the table's ends), and the
  level the table value over that gap.
- The grid types (IQ1_*, IQ2_*, IQ3_*) quantize 4 or 8 elements at once to a lattice point: no
  element-wise bound exists (:data:`GRID_TYPES`; a float reference is refused for them, and a
  producer's own decode must match exactly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .gguf_iquants import DECODERS as GRID_DECODERS
from .gguf_lowbit import (
    E2M1_DOUBLED,
    IQ4_LEVELS,
    UE4M3_HALF,
    crumbs,
    e8m0_half,
    half_field,
    iq4xs_scales,
    nibbles,
    q3k_scales,
    tq1_levels,
)

F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]
U8 = npt.NDArray[np.uint8]
Terms = tuple[F64, F64, F64, Bool, Bool]

GRID_TYPES = frozenset(GRID_DECODERS)
"""Vector-codebook types: no element-wise rounding bound."""

SCALE_EPS = {"MXFP4": 2.0**-24, "NVFP4": 2.0**-4}
"""Unit roundoff of the block scale where it is not binary16 (MXFP4's e8m0 is a power of two)."""


def _per(values: F64, width: int) -> F64:
    """``[B, S]`` per-sub-block values repeated over ``width`` elements each: ``[B, S·width]``."""
    return np.repeat(values, width, axis=1)


def _uniform(
    step: F64, level: npt.NDArray[np.integer[Any]], low: int, high: int, offset: F64 | None = None
) -> Terms:
    zero = np.zeros(level.shape)
    return step, level.astype(np.float64), zero if offset is None else offset, level == low, level == high


def _gaps(table: npt.NDArray[np.float32]) -> F64:
    """For each code, the larger gap from its level to the neighbouring distinct levels."""
    levels = np.unique(table.astype(np.float64))
    at = np.searchsorted(levels, table.astype(np.float64))
    below = np.where(at > 0, levels[at] - levels[np.maximum(at - 1, 0)], 0.0)
    above = np.where(at < len(levels) - 1, levels[np.minimum(at + 1, len(levels) - 1)] - levels[at], 0.0)
    out: F64 = np.maximum(below, above)
    return out


def _codebook(scale: F64, codes: npt.NDArray[np.integer[Any]], table: npt.NDArray[np.float32]) -> Terms:
    gap = _gaps(table)[codes]
    value = table.astype(np.float64)[codes]
    low, high = value == float(table.min()), value == float(table.max())
    return scale * gap, value / gap, np.zeros(codes.shape), low, high


def lowbit_terms(ggml_type: str, blocks: U8) -> Terms | None:
    """The rounding terms of ``[B, type_size]`` blocks of ``ggml_type``; None for other types."""
    count = blocks.shape[0]
    if ggml_type == "Q2_K":
        sc = blocks[:, 0:16].astype(np.int64)
        step = _per(half_field(blocks, 80).astype(np.float64) * (sc & 0x0F), 16)
        offset = _per(half_field(blocks, 82).astype(np.float64) * (sc >> 4), 16)
        return _uniform(step, crumbs(blocks[:, 16:80]), 0, 3, offset)
    if ggml_type == "Q3_K":
        high = (blocks[:, 0:32].astype(np.int64).reshape(count, 1, 32) >> np.arange(8).reshape(1, 8, 1)) & 1
        level = crumbs(blocks[:, 32:96]) - 4 * (1 - high.reshape(count, 256))
        step = _per(half_field(blocks, 108).astype(np.float64) * q3k_scales(blocks[:, 96:108]), 16)
        return _uniform(step, level, -4, 3)
    if ggml_type in ("TQ1_0", "TQ2_0"):
        tq1 = ggml_type == "TQ1_0"
        level = tq1_levels(blocks) if tq1 else crumbs(blocks[:, 0:64]) - 1
        d = half_field(blocks, 52 if tq1 else 64).astype(np.float64)
        return _uniform(np.broadcast_to(d, level.shape).copy(), level, -1, 1)
    if ggml_type == "IQ4_NL":
        return _codebook(half_field(blocks, 0).astype(np.float64), nibbles(blocks[:, 2:18]), IQ4_LEVELS)
    if ggml_type == "IQ4_XS":
        scale = _per(half_field(blocks, 0).astype(np.float64) * iq4xs_scales(blocks), 32)
        qs = blocks[:, 8:136].astype(np.int64).reshape(count, 8, 16)
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(count, 256)
        return _codebook(scale, codes, IQ4_LEVELS)
    if ggml_type == "MXFP4":
        scale = e8m0_half(blocks[:, 0:1]).astype(np.float64)
        return _codebook(scale, nibbles(blocks[:, 1:17]), E2M1_DOUBLED)
    if ggml_type == "NVFP4":
        scale = _per(UE4M3_HALF[blocks[:, 0:4]].astype(np.float64), 16)
        qs = blocks[:, 4:36].astype(np.int64).reshape(count, 4, 8)
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(count, 64)
        return _codebook(scale, codes, E2M1_DOUBLED)
    return None
