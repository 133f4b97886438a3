"""The one element-type table: every safetensors dtype and every GGUF (ggml) type.

Each :class:`ElementType` says how many elements a storage unit holds (``block``: 1 for an element
type, 32 or 256 for most ggml quant blocks), how many bits that unit takes (``block_bits``), the
little-endian numpy dtype a raw read is viewed as (``numpy``; ``None`` where only raw bytes make
sense: sub-byte floats and ggml quant blocks), and the float format the reference decoder widens
its values from (``float_format``; ``None`` for integers and for formats it does not decode).

The safetensors side is the ``Dtype`` enum of safetensors 0.8 (written out here: the Python package
exposes no table of it); the GGUF side comes from ``gguf.constants.GGML_QUANT_SIZES``. A name both
containers use (``F32``, ``F16``, ``BF16``, ``I8`` ... ``F64``) is one entry, and its sizes must agree.
The gates, contracts, tiles, placement and the loader derive their tables from :data:`ELEMENTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

#: safetensors dtype → (bits per element, float format the reference decoder widens, or None)
_SAFETENSORS: tuple[tuple[str, int, str | None], ...] = (
    ("BOOL", 8, None),
    ("U8", 8, None),
    ("I8", 8, None),
    ("F8_E5M2", 8, "e5m2"),
    ("F8_E4M3", 8, "e4m3"),
    ("F8_E8M0", 8, "e8m0"),
    ("F8_E4M3FNUZ", 8, None),
    ("F8_E5M2FNUZ", 8, None),
    ("F4", 4, None),
    ("F6_E2M3", 6, None),
    ("F6_E3M2", 6, None),
    ("I16", 16, None),
    ("U16", 16, None),
    ("F16", 16, "binary16"),
    ("BF16", 16, "bfloat16"),
    ("I32", 32, None),
    ("U32", 32, None),
    ("F32", 32, "binary32"),
    ("I64", 64, None),
    ("U64", 64, None),
    ("F64", 64, "binary64"),
    ("C64", 64, None),
)


@dataclass(frozen=True, slots=True)
class ElementType:
    """One storage element type (see the module docstring for the fields)."""

    name: str
    block: int
    block_bits: int
    numpy: str | None
    float_format: str | None
    safetensors: bool
    gguf_id: int | None

    @property
    def block_bytes(self) -> int | None:
        """Bytes per storage unit (a block, or one element); None for sub-byte element types."""
        return self.block_bits // 8 if self.block_bits % 8 == 0 else None

    @property
    def bits(self) -> int | None:
        """Bits per element of an element type (block 1); None for a ggml quant block."""
        return self.block_bits if self.block == 1 else None

    @property
    def itemsize(self) -> int | None:
        """Bytes per element of a whole-byte element type; None for sub-byte types and quant blocks."""
        return self.block_bytes if self.block == 1 else None


def _numpy_view(name: str, bits: int) -> str | None:
    """The numpy view of a whole-byte element type.

    Integers as themselves, IEEE floats as floats, complex as complex, every other float (BF16,
    F8_*) and BOOL as its raw unsigned bits.
    """
    if bits % 8:
        return None
    size = bits // 8
    order = "" if size == 1 else "<"
    if name[0] in "IU" and name[1:].isdigit():
        return f"{order}{name[0].lower()}{size}"
    if name in ("F16", "F32", "F64"):
        return f"<f{size}"
    if name == "C64":
        return "<c8"
    return f"{order}u{size}"


def _build() -> Mapping[str, ElementType]:
    table: dict[str, ElementType] = {}
    for name, bits, fmt in _SAFETENSORS:
        table[name] = ElementType(name, 1, bits, _numpy_view(name, bits), fmt, True, None)
    for ggml in GGMLQuantizationType:
        if ggml not in GGML_QUANT_SIZES:
            continue
        block, type_size = GGML_QUANT_SIZES[ggml]
        known = table.get(ggml.name)
        if known is not None:
            if (known.block, known.block_bits) != (block, type_size * 8):
                raise RuntimeError(f"ggml {ggml.name} is ({block}, {type_size}) but safetensors disagrees")
            table[ggml.name] = replace(known, gguf_id=int(ggml))
        else:
            view = _numpy_view(ggml.name, type_size * 8) if block == 1 else None
            table[ggml.name] = ElementType(ggml.name, block, type_size * 8, view, None, False, int(ggml))
    return MappingProxyType(table)


ELEMENTS: Mapping[str, ElementType] = _build()
"""Every element type by name (safetensors dtype or ggml type name)."""

SAFETENSORS_DTYPES: tuple[str, ...] = tuple(name for name, _, _ in _SAFETENSORS)
"""The safetensors dtypes, in the order of safetensors' ``Dtype`` enum."""

GGML_BY_ID: Mapping[int, ElementType] = MappingProxyType(
    {e.gguf_id: e for e in ELEMENTS.values() if e.gguf_id is not None}
)
"""The GGUF types by their on-disk type number."""

DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {e.name: e.itemsize for e in ELEMENTS.values() if e.itemsize is not None}
)
"""Bytes per element of every whole-byte element type (safetensors and ggml names)."""


def element(name: str) -> ElementType | None:
    """The element type called ``name``, or None."""
    return ELEMENTS.get(name)
