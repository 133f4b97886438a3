"""Physical dtypes and integer value encodings (``u4``, ``s4_twos``, ``s4_offset8``, ``s8`` ...).

An encoding names how a ``b``-bit field denotes an integer: ``u<b>`` unsigned; ``s<b>_twos`` two's
complement (``s8`` for the native int8); ``s<b>_offset<2^(b-1)>`` unsigned storage minus the offset.
``e2m1`` is the one float element: the 4-bit FP4 of MXFP4/NVFP4 (sign, 2 exponent bits, 1 mantissa
bit; every pattern a value), read through :data:`E2M1_VALUES` rather than as an integer.
"""

from __future__ import annotations

import re
from typing import Any

INT_DTYPES = ("I64", "I32", "U32", "I16", "U16", "I8", "U8")
"""The integer dtypes a packed plane may use (``I``/``U`` then the width in bits)."""


def __getattr__(name: str) -> Any:
    """``DTYPE_BYTES``: the byte widths of :mod:`shardport.registry.formats.elements`, imported on use.

    Not imported eagerly: a manifest's models (which import this module) must load without the
    element table's ``gguf`` and numpy.
    """
    if name == "DTYPE_BYTES":
        from shardport.registry.formats.elements import DTYPE_BYTES

        return DTYPE_BYTES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_ENCODING_RE = re.compile(r"u([1-8])|s([2-7])_twos|s(8)|s([2-8])_offset([0-9]+)")  # whole-string match


#: The value of each E2M1 code ``0..15`` (bit 3 the sign): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def encoding_bits(encoding: str) -> int:
    """Return the bit width of a value encoding (``u4`` → 4, ``s4_offset8`` → 4, ``s8`` → 8)."""
    if encoding == "e2m1":
        return 4
    match = _ENCODING_RE.fullmatch(encoding)
    if match is None:
        raise ValueError(f"unknown value encoding {encoding!r} (u<b>, s<b>_twos, s8, s<b>_offset<2^(b-1)>)")
    width = next(group for group in match.groups() if group is not None)
    bits = int(width)
    offset = match.group(5)
    if offset is not None and int(offset) != 1 << (bits - 1):
        raise ValueError(f"value encoding {encoding!r}: the offset of s{bits} must be {1 << (bits - 1)}")
    return bits


def encoding_value_range(encoding: str) -> tuple[int, int]:
    """Return the closed range of integer values the encoding denotes (after any offset)."""
    if encoding == "e2m1":
        raise ValueError("e2m1 denotes floats, not integers: read it through E2M1_VALUES")
    bits = encoding_bits(encoding)
    if encoding.startswith("u"):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
