"""Unpacking integer fields from packed planes, by bit position (slow, explicit, exact).

A packed plane is a 2-D array of containers. Orienting it so that dimension 0 runs over the row axis
(N), the fields run along the pack axis; element ``e`` of a line starts at a bit position given by the
:class:`~.model.Packing` (slot order, bit order, bitstream), counted in the little-endian container
sequence of its line. Selected rows are unpacked without touching the others.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .model import Packing

I64 = npt.NDArray[np.int64]


def packed_extent(count: int, bits: int, packing: Packing) -> int:
    """Return how many containers hold ``count`` fields along the pack axis."""
    if packing.axis == "none":
        return count
    if packing.scheme == "bitstream":
        return -(-count * bits // packing.container_bits)
    per = packing.container_bits // bits
    return -(-count // per)


def tail_is_exact(count: int, bits: int, packing: Packing) -> bool:
    """Return whether ``count`` fields fill their last container completely."""
    if packing.axis == "none":
        return True
    return (count * bits) % packing.container_bits == 0


def field_positions(indices: I64, bits: int, packing: Packing) -> I64:
    """Return the starting bit (from the LSB of the line's first container) of each element index."""
    if packing.scheme == "bitstream":
        return indices * bits
    per = packing.container_bits // bits
    slot_of_lane = np.empty(per, dtype=np.int64)
    slot_of_lane[np.asarray(packing.slot_order, dtype=np.int64)] = np.arange(per, dtype=np.int64)
    slot = slot_of_lane[indices % per]
    shift = slot * bits if packing.bit_order == "lsb_first" else packing.container_bits - (slot + 1) * bits
    return (indices // per) * packing.container_bits + shift


def extract_fields(lines: npt.NDArray[np.uint64], positions: I64, bits: int, container_bits: int) -> I64:
    """Read the ``bits``-wide unsigned field at each bit position of every line (``[..., C]``).

    Returns ``[..., E]`` for ``E`` positions; a field may straddle two containers.
    """
    word = positions // container_bits
    offset = (positions % container_bits).astype(np.uint64)
    low = lines[..., word] >> offset
    straddles = (positions % container_bits) + bits > container_bits
    if np.any(straddles):
        next_word = np.minimum(word + 1, lines.shape[-1] - 1)
        high = lines[..., next_word] << (np.uint64(container_bits) - offset)
        low = np.where(straddles, low | high, low)
    mask = np.uint64((1 << bits) - 1)
    return (low & mask).astype(np.int64)


def _as_lines(plane: npt.NDArray[np.generic]) -> npt.NDArray[np.uint64]:
    """Reinterpret integer containers as unsigned and widen to uint64 for shifting."""
    unsigned = plane.view(np.dtype(f"<u{plane.dtype.itemsize}"))
    return unsigned.astype(np.uint64)


def unpack_rows(
    plane: npt.NDArray[np.generic],
    axes: tuple[str, ...],
    bits: int,
    packing: Packing,
    extents: Mapping[str, int],
    rows: I64 | None,
) -> I64:
    """Unpack a 2-D plane into raw field values oriented ``[rows of N, other axis]``.

    ``axes`` names the physical dimensions (one of them ``N``), ``extents`` gives the logical count of
    fields along each axis name, and ``rows`` selects N indices (``None`` = all). For unpacked planes
    (``axis="none"``) the value is the container's integer value, signed or not per its dtype.
    """
    other = axes[1] if axes[0] == "N" else axes[0]
    oriented = plane if axes[0] == "N" else plane.T
    if packing.axis == "none":
        values = oriented.astype(np.int64)
        return values if rows is None else values[rows]
    lines = _as_lines(np.ascontiguousarray(oriented))
    if packing.axis == "N":
        wanted = np.arange(extents["N"], dtype=np.int64) if rows is None else rows
        positions = field_positions(wanted, bits, packing)
        return extract_fields(np.ascontiguousarray(lines.T), positions, bits, packing.container_bits).T
    selected = lines if rows is None else lines[rows]
    positions = field_positions(np.arange(extents[other], dtype=np.int64), bits, packing)
    return extract_fields(selected, positions, bits, packing.container_bits)


def padding_fields(
    plane: npt.NDArray[np.generic],
    axes: tuple[str, ...],
    bits: int,
    packing: Packing,
    extents: Mapping[str, int],
) -> I64:
    """Return every unused (padding) bit of the plane's last containers, one bit per value."""
    if packing.axis == "none":
        return np.zeros(0, dtype=np.int64)
    count = extents[packing.axis]
    total_bits = packed_extent(count, bits, packing) * packing.container_bits
    last = total_bits - packing.container_bits
    starts = field_positions(np.arange(count, dtype=np.int64), bits, packing)
    touching = starts[starts + bits > last]
    used = {int(start) + offset for start in touching for offset in range(bits)}
    unused = np.array([bit for bit in range(last, total_bits) if bit not in used], dtype=np.int64)
    if unused.size == 0:
        return unused
    oriented = plane if axes[-1] == packing.axis else plane.T
    lines = _as_lines(np.ascontiguousarray(oriented))
    return extract_fields(lines, unused, 1, packing.container_bits).reshape(-1)


def apply_encoding(stored: I64, encoding: str, bits: int, *, packed: bool) -> I64:
    """Map raw field values to the integers the encoding denotes.

    Packed fields are unsigned bit patterns; unpacked containers already hold signed integers for
    ``_twos``/``s8`` encodings and unsigned integers otherwise.
    """
    if "_offset" in encoding:
        return stored - (1 << (bits - 1))
    if encoding.startswith("s") and packed:
        return np.where(stored >= 1 << (bits - 1), stored - (1 << bits), stored)
    return stored
