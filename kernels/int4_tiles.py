"""Where each 4-bit field of a packed code plane lands in a decoded tile, and the tile decoder itself.

A code plane is read as it was loaded: ``[outer, inner]`` containers (8/16/32-bit) with physical axes
``(N, K)`` or ``(K, N)``, its 4-bit fields packed along one of them. A *tile* is a slab of whole lines
along the outer axis, decoded into float32 ``[rows, cols]``; the fields are split with whole-line
torch ops only (one shift or mask per nibble position, never a loop per row):

- packed along the outer axis (GPTQ ``qweight [K/8, N]``): each container line becomes ``per`` tile
  rows, row ``w·per + p`` holding the field at bits ``4p`` of every container of line ``w``
  (``(line >> 4p) & 15``, contiguous along the inner axis);
- packed along the inner axis (AWQ ``qweight [K, N/8]``, compressed-tensors ``weight_packed
  [N, K/8]``): the line's bytes ``[L]`` become ``[2, L]`` -- the low nibbles, then the high nibbles
  (*planar*; interleaving them costs 2-4x more, measured) -- so column ``h·L + j`` holds nibble ``h`` of
  byte ``j``.

Either way the tile's positions are a fixed permutation of the weight's elements (the slot order, the
bit order and the planar split), computed once as index arrays (:class:`TileLayout`): the activations'
columns are gathered into position order along K, and the output is gathered back along N, so the
decoded tile is never permuted. Positions past the logical extent (a zero-filled tail container) map
to ``-1``: a zero column of the activations along K, a dropped output along N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.model import Packing

from .errors import KernelInputError

I64 = npt.NDArray[np.int64]
#: numpy/torch dtype name of a container that the outer-axis shifts read (``>>`` then ``& 15``).
_CONTAINER = {8: "uint8", 16: "int16", 32: "int32"}


@dataclass(frozen=True, eq=False)
class TileLayout:
    """How a code plane's fields map to tile positions (see the module docstring).

    ``outer``: the logical axis of the plane's first physical axis (tiles are slabs of it);
    ``packed_outer``: fields packed along it (else along the inner axis); ``per``: fields per
    container; ``outer_elem``/``inner_elem``: the element index (N row, or stored K column) of each
    outer/inner tile position, -1 for padding; ``planes``: equal runs the inner positions come in (2
    for the planar nibble split, else 1).
    """

    outer: Literal["N", "K"]
    packed_outer: bool
    per: int
    container_bits: int
    outer_elem: I64
    inner_elem: I64
    planes: int

    @property
    def rows(self) -> int:
        """Tile positions along the outer axis (the padded extent)."""
        return int(self.outer_elem.size)

    @property
    def cols(self) -> int:
        """Tile positions along the inner axis (the padded extent)."""
        return int(self.inner_elem.size)

    @property
    def n_elem(self) -> I64:
        """The N row of each tile position along N (-1: padding)."""
        return self.outer_elem if self.outer == "N" else self.inner_elem

    @property
    def k_elem(self) -> I64:
        """The stored K column of each tile position along K (-1: padding)."""
        return self.inner_elem if self.outer == "N" else self.outer_elem

    @property
    def unit(self) -> int:
        """Outer positions a slab boundary must be a multiple of (one container line)."""
        return self.per if self.packed_outer else 1


def nibble_elements(packing: Packing, per: int, containers: int) -> I64:
    """Element index of nibble ``p`` (bits ``4p``..) of each container, flattened over ``containers``."""
    p = np.arange(per, dtype=np.int64)
    if packing.scheme == "bitstream":
        offset = p  # element e at bit 4e of the little-endian container sequence
    else:
        slot = p if packing.bit_order == "lsb_first" else per - 1 - p
        offset = np.asarray(packing.slot_order, dtype=np.int64)[slot]
    return (np.arange(containers, dtype=np.int64)[:, None] * per + offset[None, :]).reshape(-1)


def _masked(elements: I64, extent: int) -> I64:
    out: I64 = np.where(elements < extent, elements, -1)
    return out


def tile_layout(
    where: str, axes: tuple[str, ...], packing: Packing, shape: tuple[int, ...], n: int, k: int
) -> TileLayout:
    """The layout of a 4-bit code plane of physical ``shape`` over ``axes`` for a ``[n, k]`` weight."""
    if packing.axis == "none" or packing.container_bits not in _CONTAINER:
        raise KernelInputError(
            where, "codes packing", "4-bit fields packed in 8/16/32-bit containers", packing.model_dump()
        )
    per = packing.container_bits // 4
    extents = {"N": n, "K": k}
    outer, inner = axes[0], axes[1]
    lines, width = shape
    if packing.axis == outer:
        outer_elem = _masked(nibble_elements(packing, per, lines), extents[outer])
        inner_elem = _masked(np.arange(width, dtype=np.int64), extents[inner])
        planes = 1
    else:
        nbytes = width * packing.container_bits // 8
        stream = nibble_elements(packing, per, width)  # nibble-stream position q -> element
        planar = np.arange(2 * nbytes, dtype=np.int64)  # column h·L + j holds stream position 2j + h
        inner_elem = _masked(stream[2 * (planar % nbytes) + planar // nbytes], extents[inner])
        outer_elem = _masked(np.arange(lines, dtype=np.int64), extents[outer])
        planes = 2
    if not (np.any(outer_elem >= 0) and np.any(inner_elem >= 0)):
        raise KernelInputError(where, "codes plane", f"fields for [{n}, {k}]", list(shape))
    along: Literal["N", "K"] = "N" if outer == "N" else "K"
    bits = packing.container_bits
    return TileLayout(along, packing.axis == outer, per, bits, outer_elem, inner_elem, planes)


def container_view(layout: TileLayout, plane: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The plane as the tile decoder reads it, zero-copy: containers (outer-packed) or bytes (inner)."""
    if layout.packed_outer:
        return plane.view(np.dtype(_CONTAINER[layout.container_bits]).newbyteorder("<"))
    return plane.view(np.uint8).reshape(plane.shape[0], -1)


def decode_codes(layout: TileLayout, codes: Any, p0: int, p1: int, tile: Any, twos: bool) -> None:
    """Write the stored 4-bit fields of outer positions ``p0..p1`` into float32 ``tile [p1-p0, cols]``.

    ``codes``: the torch view of :func:`container_view`; ``twos``: flip bit 3 (two's complement
    fields become ``q + 8``). Integer scratch the size of the tile is allocated per call.
    """
    import torch

    rows = p1 - p0
    if layout.packed_outer:
        per = layout.per
        lines = codes[p0 // per : p1 // per]
        scratch = torch.empty(lines.shape[0], per, lines.shape[1], dtype=lines.dtype)
        for p in range(per):
            torch.bitwise_right_shift(lines, 4 * p, out=scratch[:, p])
        scratch.bitwise_and_(15)
    else:
        src = codes[p0:p1]
        scratch = torch.empty(rows, 2, src.shape[1], dtype=torch.uint8)
        torch.bitwise_and(src, 15, out=scratch[:, 0])
        torch.bitwise_right_shift(src, 4, out=scratch[:, 1])
    if twos:
        scratch.bitwise_xor_(8)
    tile.copy_(scratch.view(rows, -1))
