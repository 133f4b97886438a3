"""Tile index: per-tile BLAKE3 hashes that let a rank verify every byte it read without reading the rest.

Specification (version 1)
-------------------------
*Plane as a byte matrix.* Each tensor (plane) of a manifest is viewed as a physical row-major byte
matrix: ``rows = shape[0]`` (1 for 0-/1-D tensors) and ``row_bytes = nbytes / rows``. The column
*quantum* ``q`` is the smallest byte unit never split: the element size (sub-byte dtypes rounded up to
whole bytes holding whole elements: F4 → 1, F6 → 3), or the bytes per block of a GGUF block type
(``Q4_1`` → 20; a GGUF row is ``elements / block_size x bytes_per_block`` bytes).

*Grid.* ``row_block`` rows x ``col_block`` bytes (a multiple of ``q``), recorded per tensor and chosen by
:func:`plan_grid` (rule in :mod:`.tiles_grid`): along an axis of length ``n`` (rows, or quanta) with
``L`` = the largest of 24, 12, 8, 6, 4, 3, 2, 1 dividing ``n``, the block divides ``n / L``, so the
block count is a multiple of ``L`` and every split into ``tp ∈ {2, 3, 4, 6, 8}`` equal parts with
``tp | n`` lands on tile boundaries (an axis with ``L = 1`` is free: any block, the last one ragged).
The tile is the largest such ≤ ``tile_target`` (default 1 MiB) and ≥ ``tile_minimum`` (default
64 KiB), ties to the wider; if none fits, the smallest ≥ the minimum. A tensor of at most
``tile_minimum`` bytes is one tile. Only when no aligned tile reaches the minimum is the alignment
relaxed (factor 3 first, then halving), so small quantized matrices may lose tp-8 alignment on one axis.

*Tiles.* Tile ``(i, j)`` covers rows ``[i·rb, min((i+1)·rb, rows))`` and byte columns
``[j·cb, min((j+1)·cb, row_bytes))``. Its hash is BLAKE3 (32-byte output, lowercase hex) of the
concatenation, row by row, of its runs: file bytes ``[start + r·row_bytes + j·cb, … + width)``.
``hashes`` lists tiles row-major (``i · grid_cols + j``). A zero-byte tensor has one empty tile.

*Layout.* ``layout`` says where a tile's bytes lie in the file. ``"row_major"`` (the default, and every
index written before the field existed): the tensor is its row-major byte matrix, so tile ``(i, j)`` is
``rows_i`` runs of ``width`` bytes, ``row_bytes`` apart, from ``start + i·rb·row_bytes + j·cb``.
``"tiled"`` (the ``shardport-tiled`` layout of converted artifacts, :mod:`.tiled_layout`): the tensor's
region ``[start, start + rows·row_bytes)`` holds its tiles one after another in row-major tile order,
each row-major inside itself, so tile ``(i, j)`` is one contiguous run of ``rows_i · width`` bytes at
``start + i·rb·row_bytes + rows_i·j·cb`` (``rows_i = min(rb, rows - i·rb)``). The hashed byte string
(the tile's rows, in order) is the same in both layouts, so a conversion keeps every hash.

*Document.* :class:`TileIndex` ``{version: 1, hash: "blake3", tile_target, tile_minimum, tensors: {name:
TensorTiles{file, start, rows, row_bytes, row_block, col_block, hashes, layout}}}`` serialized as
canonical JSON (RFC 8785); its blob digest is the sha256 of those bytes. Parsing is bounded: integers in
``[0, 2**53)``, no offset overflow, blocks within the matrix, hash count = grid size, 64-hex hashes,
``layout`` one of ``"row_major"``, ``"tiled"`` (absent: ``"row_major"``).

Public API: :func:`plan_grid`, :func:`build_tile_index` (+ :class:`CheckpointReader`),
:func:`tiles_for` (:func:`tile_span`), :func:`tile_pieces`, :func:`verify_tile`, :func:`tile_hash` (streaming:
:func:`tile_hasher` + :func:`check_tile`); errors
:class:`TileDigestMismatchError` (a ``DigestMismatchError``), :class:`TileIndexError`,
:class:`TileGridError`.
"""

from .tiles_build import CheckpointReader, Reader, build_tile_index
from .tiles_errors import TileDigestMismatchError, TileGridError, TileIndexError
from .tiles_grid import (
    DEFAULT_MINIMUM,
    DEFAULT_TARGET,
    LADDER,
    GridChoice,
    PlaneLayout,
    choose_grid,
    plan_grid,
    plane_layout,
)
from .tiles_model import (
    HASH_NAME,
    MEDIA_TYPE,
    BytesLike,
    Layout,
    TensorTiles,
    TileIndex,
    check_tile,
    tile_hash,
    tile_hasher,
    tile_nbytes,
    tile_pieces,
    tile_span,
    tiles_for,
    verify_tile,
)

__all__ = [
    "DEFAULT_MINIMUM",
    "DEFAULT_TARGET",
    "HASH_NAME",
    "LADDER",
    "MEDIA_TYPE",
    "BytesLike",
    "CheckpointReader",
    "GridChoice",
    "Layout",
    "PlaneLayout",
    "Reader",
    "TensorTiles",
    "TileDigestMismatchError",
    "TileGridError",
    "TileIndex",
    "TileIndexError",
    "build_tile_index",
    "check_tile",
    "choose_grid",
    "plan_grid",
    "plane_layout",
    "tile_hash",
    "tile_hasher",
    "tile_nbytes",
    "tile_pieces",
    "tile_span",
    "tiles_for",
    "verify_tile",
]
