"""Tile index: per-tile BLAKE3 hashes that let a rank verify every byte it read without reading the rest.

Specification (version 2; version 1 documents are still read)
--------------------------------------------------------------
*Plane as a byte matrix.* Each tensor (plane) of a manifest is viewed as a physical row-major byte
matrix: ``rows = shape[0]`` (1 for 0-/1-D tensors) and ``row_bytes = nbytes / rows``. The column
*quantum* ``q`` is the smallest byte unit never split: the element size (sub-byte dtypes rounded up to
whole bytes holding whole elements: F4 → 1, F6 → 3), or the bytes per block of a GGUF block type
(``Q4_1`` → 20; a GGUF row is ``elements / block_size x bytes_per_block`` bytes).

*Grid.* ``row_block`` rows x ``col_block`` bytes (a multiple of ``q``), recorded per tensor and chosen by
:func:`plan_grid` (rules in :mod:`.grid`). Push gives every plane of a logical weight its *cuts*
(:func:`.splits.plane_cuts`): the points along its rows and column quanta where placement can split
it for any tp ∈ {2, 3, 4, 6, 8} it accepts on the model (column, row, kv-head, vocab and expert splits,
after the planner's group/block/head alignment) and the unit no tile may cut (a quantization group of a
packed plane; blocks and words are whole quanta). Each block then divides the gcd of its axis's points
and is a multiple of its unit, however small the tensor: the tile is the largest such ≤ ``tile_target``
(ties to the wider), whole rows when the columns have no points. A tensor without cuts (one no weight
binds) keeps the generic rule: along an axis of length ``n`` with ``L`` = the largest of 24, 12, 8, 6,
4, 3, 2, 1 dividing ``n``, the block divides ``n / L``; the tile is the largest such ≤ ``tile_target``
(default 1 MiB) and ≥ ``tile_minimum`` (default 64 KiB); a tensor of at most ``tile_minimum`` bytes is
one tile.

*Tiles.* Tile ``(i, j)`` covers rows ``[i·rb, min((i+1)·rb, rows))`` and byte columns
``[j·cb, min((j+1)·cb, row_bytes))``. Its hash is BLAKE3 (32-byte output, lowercase hex) of the
concatenation, row by row, of its runs: file bytes ``[start + r·row_bytes + j·cb, … + width)``.
``hashes`` lists tiles row-major (``i · grid_cols + j``). A zero-byte tensor has one empty tile.

*Layout.* ``layout`` says where a tile's bytes lie in the file. ``"row_major"`` (the default, and every
index written before the field existed): the tensor is its row-major byte matrix, so tile ``(i, j)`` is
``rows_i`` runs of ``width`` bytes, ``row_bytes`` apart, from ``start + i·rb·row_bytes + j·cb``.
``"tiled"`` (the ``shardport-tiled`` layout of converted artifacts, :mod:`.layout`): the tensor's
region ``[start, start + rows·row_bytes)`` holds its tiles one after another in row-major tile order,
each row-major inside itself, so tile ``(i, j)`` is one contiguous run of ``rows_i · width`` bytes at
``start + i·rb·row_bytes + rows_i·j·cb`` (``rows_i = min(rb, rows - i·rb)``). The hashed byte string
(the tile's rows, in order) is the same in both layouts, so a conversion keeps every hash.

*Document.* :class:`TileIndex`, serialized as canonical JSON (RFC 8785); its blob digest is the sha256
of those bytes. Version 2 (written): ``{version: 2, hash: "blake3", tile_target, tile_minimum, files:
[name, …], tensors: {name: [file, start, rows, row_bytes, row_block, col_block, layout, hashes]}}`` with
``file`` an index into ``files`` and ``hashes`` the standard base64 (padded) of the tiles' 32-byte
digests concatenated in tile order — 43 bytes a tile instead of 67, so that cutting small tensors at
every split point keeps the index well under 0.1% of a checkpoint. Version 1 (read): ``tensors: {name:
{file, start, rows, row_bytes, row_block, col_block, hashes: [64-hex, …], layout}}``. Parsing is
bounded: integers in ``[0, 2**53)``, no offset overflow, blocks within the matrix, hash count = grid
size, canonical base64 of whole digests (64-hex hashes in version 1), ``layout`` one of
``"row_major"``, ``"tiled"`` (absent in version 1: ``"row_major"``).

Public API (imported lazily from the modules that define it): :func:`plan_grid`, :func:`build_tile_index`
(+ :class:`CheckpointReader`),
:func:`tiles_for` (:func:`tile_span`), :func:`tile_pieces`, :func:`verify_tile`, :func:`tile_hash` (streaming:
:func:`tile_hasher` + :func:`check_tile`); errors
:class:`TileDigestMismatchError` (a ``DigestMismatchError``), :class:`TileIndexError`,
:class:`TileGridError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from shardport.registry.tiles.build import CheckpointReader, Reader, build_tile_index
    from shardport.registry.tiles.errors import TileDigestMismatchError, TileGridError, TileIndexError
    from shardport.registry.tiles.grid import (
        DEFAULT_MINIMUM,
        DEFAULT_TARGET,
        LADDER,
        GridChoice,
        PlaneLayout,
        choose_grid,
        plan_grid,
        plane_layout,
        tiles_mismatch,
    )
    from shardport.registry.tiles.model import (
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

#: Where each exported name lives; imported on first use (PEP 562).
_HOME = {
    **dict.fromkeys(("CheckpointReader", "Reader", "build_tile_index"), "build"),
    **dict.fromkeys(("TileDigestMismatchError", "TileGridError", "TileIndexError"), "errors"),
    **dict.fromkeys(
        (
            "DEFAULT_MINIMUM",
            "DEFAULT_TARGET",
            "LADDER",
            "GridChoice",
            "PlaneLayout",
            "choose_grid",
            "plan_grid",
        ),
        "grid",
    ),
    **dict.fromkeys(("plane_layout", "tiles_mismatch"), "grid"),
    **dict.fromkeys(("HASH_NAME", "MEDIA_TYPE", "BytesLike", "Layout", "TensorTiles", "TileIndex"), "model"),
    **dict.fromkeys(("check_tile", "tile_hash", "tile_hasher", "tile_nbytes", "tile_pieces"), "model"),
    **dict.fromkeys(("tile_span", "tiles_for", "verify_tile"), "model"),
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

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
    "tiles_mismatch",
    "verify_tile",
]
