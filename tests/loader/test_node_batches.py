"""A node's ranks splitting tiled tile rows by columns: their bands are batched together, one request.

Tensor ``w`` (8 rows x 1024 bytes, tiles of 4 rows x 256 bytes, tiled layout) is split by columns among
4 ranks: each rank's band is its tile column over both tile rows (two runs, three tiles apart). Read
together the four bands fill both tile rows: one range. A one-tile tensor ``n`` before it, and a batch
of exactly ``w``'s bytes: packed band by band, ``n`` and three of the bands made one batch and the
fourth another, neither holding a whole tile row, so each band was read run by run (9 requests:
``n``, six runs, two runs); kept together, 2.
"""

from __future__ import annotations

from shardport.loader import PlaneSlice, schedule_reads
from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.tiles.layout import LAYOUT
from shardport.registry.tiles.model import TensorTiles, TileIndex

FILE = "model.bin"
HEADER = 64
N_BYTES = 64
W_ROWS, W_ROW_BYTES, ROW_BLOCK, COL_BLOCK = 8, 1024, 4, 256


def _tensor(
    name: str, start: int, rows: int, row_bytes: int, rb: int, cb: int
) -> tuple[TensorEntry, TensorTiles]:
    entry = TensorEntry(
        name=name,
        file=FILE,
        start=start,
        end=start + rows * row_bytes,
        dtype="U8",
        shape=(rows, row_bytes),
        layout=LAYOUT,
        tile_rows=rb,
        tile_cols=cb,
    )
    count = -(-rows // rb) * -(-row_bytes // cb)
    tiles = TensorTiles(
        file=FILE,
        start=start,
        rows=rows,
        row_bytes=row_bytes,
        row_block=rb,
        col_block=cb,
        hashes=tuple(f"{name}{k}".encode().hex().ljust(64, "0") for k in range(count)),
        layout="tiled",
    )
    return entry, tiles


def test_a_nodes_column_split_tile_rows_are_one_batch_and_one_request() -> None:
    n, n_tiles = _tensor("n", HEADER, 1, N_BYTES, 1, N_BYTES)
    w, w_tiles = _tensor("w", n.end, W_ROWS, W_ROW_BYTES, ROW_BLOCK, COL_BLOCK)
    files = [FileEntry(path=FILE, size=w.end, digest="sha256:" + "ab" * 32)]
    index = TileIndex(tensors={"n": n_tiles, "w": w_tiles})
    ranks = W_ROW_BYTES // COL_BLOCK
    slices = [PlaneSlice("n", 0, 1, 0, N_BYTES)] + [
        PlaneSlice("w", 0, W_ROWS, r * COL_BLOCK, (r + 1) * COL_BLOCK) for r in range(ranks)
    ]
    schedule = schedule_reads(slices, [n, w], files, index, batch_bytes=W_ROWS * W_ROW_BYTES, max_gap=0)
    w_bands = [
        (k, band) for k, batch in enumerate(schedule.batches) for band in batch.bands if band.tensor == "w"
    ]
    assert len(w_bands) == ranks and all(not band.contiguous for _, band in w_bands)  # narrow: 2 runs each
    assert {k for k, _ in w_bands} == {len(schedule.batches) - 1}  # all in one batch
    assert schedule.bytes_fetched == N_BYTES + W_ROWS * W_ROW_BYTES
    assert [b.fetch.requests for b in schedule.batches] == [1, 1]
    assert schedule.batches[-1].fetch.spans[0].length == W_ROWS * W_ROW_BYTES
