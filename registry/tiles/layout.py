"""The ``shardport-tiled`` layout: a tensor's tiles stored contiguously, for object stores.

A tensor viewed as its row-major byte matrix (``rows`` x ``row_bytes``, the tile index's view) is cut
into tiles of ``row_block`` rows x ``col_block`` bytes (the tile index's grid). In the tiled layout the
tensor occupies one region of ``rows * row_bytes`` bytes holding its tiles in row-major tile order
``(0,0), (0,1), …, (1,0), …``; each tile's bytes are contiguous and row-major inside the tile — exactly
the byte string the tile hash covers. So tile ``(i, j)`` starts at::

    region_start + i * row_block * row_bytes + rows_i * j * col_block

where ``rows_i = min(row_block, rows - i * row_block)``. Tile hashes are the same in both layouts.
Pure numpy; used by convert (row-major → tiled), by readers of tiled planes (tiled → row-major) and by
the loader (tile offsets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy only where bytes are moved: reading a manifest names LAYOUT without it
    import numpy as np
    import numpy.typing as npt

from shardport.registry.errors import UsageError

LAYOUT = "shardport-tiled"
LAYOUT_VERSION = 1


def tile_offset(rows: int, row_bytes: int, row_block: int, col_block: int, i: int, j: int) -> int:
    """Offset of tile ``(i, j)`` from the start of the tensor's region."""
    rows_i = min(row_block, rows - i * row_block)
    return i * row_block * row_bytes + rows_i * j * col_block


def _check(data: npt.NDArray[np.uint8], rows: int, row_bytes: int, row_block: int, col_block: int) -> None:
    if data.size != rows * row_bytes or row_block < 1 or col_block < 1:
        raise UsageError(
            f"tiled layout: {data.size} bytes for {rows} x {row_bytes}, blocks {row_block} x {col_block}"
        )


def to_tiled(
    data: npt.NDArray[np.uint8], rows: int, row_bytes: int, row_block: int, col_block: int
) -> npt.NDArray[np.uint8]:
    """Row-major tensor bytes → tiled layout bytes (a new array)."""
    _check(data, rows, row_bytes, row_block, col_block)
    matrix = data.reshape(rows, row_bytes)
    import numpy as np

    out = np.empty(rows * row_bytes, dtype=np.uint8)
    at = 0
    for r0 in range(0, rows, row_block):
        band = matrix[r0 : r0 + row_block]
        for c0 in range(0, row_bytes, col_block):
            tile = band[:, c0 : c0 + col_block]
            out[at : at + tile.size].reshape(tile.shape)[...] = tile  # one strided copy, no temporary
            at += tile.size
    return out


def from_tiled(
    data: npt.NDArray[np.uint8], rows: int, row_bytes: int, row_block: int, col_block: int
) -> npt.NDArray[np.uint8]:
    """Tiled layout bytes → row-major tensor bytes (a new array)."""
    _check(data, rows, row_bytes, row_block, col_block)
    import numpy as np

    out = np.empty((rows, row_bytes), dtype=np.uint8)
    at = 0
    for r0 in range(0, rows, row_block):
        r1 = min(rows, r0 + row_block)
        for c0 in range(0, row_bytes, col_block):
            c1 = min(row_bytes, c0 + col_block)
            n = (r1 - r0) * (c1 - c0)
            out[r0:r1, c0:c1] = data[at : at + n].reshape(r1 - r0, c1 - c0)
            at += n
    return out.reshape(-1)
