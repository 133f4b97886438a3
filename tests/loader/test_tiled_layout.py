"""Verified range reads of artifacts in the ``shardport-tiled`` layout, against their row-major twins.

A real safetensors file is published row-major; a tiled copy of it (every tensor rewritten with
:func:`~shardport.registry.tiles.layout.to_tiled`, at new offsets, in another order) is published next
to it with a tile index holding the same hashes and ``layout="tiled"``. Both must read back the same
slices; the tiled one reads a column slice with a request per tile row instead of one per matrix row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_artifacts import (
    TILED_FILE,
    Artifact,
    load,
    publish,
    rank_slices,
    rectangles,
    tiled_copy,
    write_safetensors,
)

from shardport.loader import PlaneSlice, schedule_reads
from shardport.loader.ranges import plan_fetch
from shardport.registry.tiles.errors import TileDigestMismatchError
from shardport.registry.tiles.layout import from_tiled
from shardport.registry.tiles.model import TileIndex, tile_nbytes, tile_pieces, verify_tile


def twins(root: Path, store_url: str, **shape: int) -> tuple[Artifact, Artifact]:
    """A row-major artifact and its tiled copy, in one store."""
    small = {"target": 8 << 10, "minimum": 512} if shape else {"minimum": 2 << 10}
    art = publish(write_safetensors(root / "ckpt", **shape), store_url, **small)
    return art, tiled_copy(art, root / "tiled", store_url)


@pytest.fixture(scope="module")
def local_twins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, Artifact]:
    root = tmp_path_factory.mktemp("tiled")
    return twins(root, str(root / "store"))


def aligned(art: Artifact, slices: list[PlaneSlice]) -> bool:
    """Whether every slice edge lies on its tensor's tile grid (or the matrix edge)."""

    def on(x: int, block: int, end: int) -> bool:
        return x % block == 0 or x == end

    return all(
        on(s.row0, t.row_block, t.rows)
        and on(s.row1, t.row_block, t.rows)
        and on(s.col0, t.col_block, t.row_bytes)
        and on(s.col1, t.col_block, t.row_bytes)
        for s in slices
        for t in [art.index.tensors[s.tensor]]
    )


def requests_for(art: Artifact, s: PlaneSlice) -> int:
    """Requests the loader's plan issues for ``s`` alone (the default local options)."""
    plan = schedule_reads([s], art.entries, art.files, art.index, max_gap=4096, gap_budget=0.02)
    return plan.requests


def test_tiled_copy_keeps_every_hash_and_tile_pieces_follow_the_layout(
    local_twins: tuple[Artifact, Artifact],
) -> None:
    art, tiled = local_twins
    data = tiled.raw
    for e in tiled.entries:
        t = tiled.index.tensors[e.name]
        assert t.layout == "tiled" and t.hashes == art.index.tensors[e.name].hashes
        covered = t.start
        for i in range(t.grid_rows):
            for j in range(t.grid_cols):
                pieces = tile_pieces(t, i, j)
                assert len(pieces) == 1 and pieces[0] == (covered, tile_nbytes(t, i, j))
                assert t.tile_range(i, j) == (covered, covered + tile_nbytes(t, i, j))
                covered += pieces[0][1]
                offset, length = pieces[0]
                verify_tile(t, i, j, data[offset : offset + length], tensor=e.name)
        assert covered == t.end  # the tiles fill the tensor's region, in row-major tile order
        region = np.frombuffer(data, np.uint8, t.nbytes, t.start)
        back = from_tiled(region, t.rows, t.row_bytes, t.row_block, t.col_block)
        assert np.array_equal(back.reshape(t.rows, t.row_bytes), art.matrix(e.name))
    # row-major indexes say so; version-1 documents written before the field parse as row-major
    doc = art.index.to_bytes()
    assert b'"row_major"' in doc and b'"tiled"' not in doc and b'"tiled"' in tiled.index.to_bytes()
    legacy = json.dumps(
        {
            "version": 1,
            "hash": "blake3",
            "tensors": {n: t.model_dump(exclude={"layout"}) for n, t in art.index.tensors.items()},
        }
    ).encode()
    assert b'"layout"' not in legacy
    assert TileIndex.from_bytes(legacy).tensors == art.index.tensors


@pytest.mark.parametrize(
    "options",
    [{}, {"page_cache": False}, {"page_cache": False, "max_gap": 0}],
    ids=["mapped", "preadv", "runs"],
)
@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tiled_reads_equal_row_major_reads(
    local_twins: tuple[Artifact, Artifact], axis: str, tp: int, options: dict[str, bool | int]
) -> None:
    art, tiled = local_twins
    for rank in range(tp):
        slices = rank_slices(art, tp, rank, axis)
        want, got = load(art, slices), load(tiled, slices, **options)
        for s, a, b in zip(slices, want.arrays, got.arrays, strict=True):
            assert np.array_equal(a, art.expected(s)) and np.array_equal(b, a), s
        ledger = got.ledger
        assert aligned(tiled, slices)
        assert ledger.read_amplification <= 1.05, ledger
        assert ledger.peak_staging_bytes == 0  # aligned slices are read straight into their arrays
        assert ledger.bytes_verified == want.ledger.bytes_verified
        assert ledger.tiles == want.ledger.tiles
        if axis == "row":  # consecutive whole tile rows are one run: a request per tensor at most
            assert ledger.requests <= len(slices)
        for s in slices:  # a column slice: at most one request per tile row
            assert requests_for(tiled, s) <= tiled.index.tensors[s.tensor].grid_rows


@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
@pytest.mark.parametrize("tp", [2, 4])
def test_node_read_of_tiled_column_slices_stacks_tile_rows_and_reads_each_region_once(
    local_twins: tuple[Artifact, Artifact], tp: int, page_cache: bool
) -> None:
    art, tiled = local_twins
    union = [s for rank in range(tp) for s in rank_slices(art, tp, rank, "col")]
    schedule = schedule_reads(union, tiled.entries, tiled.files, tiled.index, max_gap=4096, gap_budget=0.02)
    bands = [b for batch in schedule.batches for b in batch.bands]
    assert any(b.i1 - b.i > 1 and b.tile_width for b in bands)  # tile rows stacked, tiles side by side
    result = load(tiled, union, page_cache=page_cache)
    for s, got in zip(union, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s)), s
    ledger = result.ledger
    assert ledger.read_amplification <= 1.05
    # the ranks' interleaved tile rows are one read per batch region, never one per tile row per rank
    assert ledger.requests <= sum(t.grid_rows for t in tiled.index.tensors.values())


def test_column_slice_requests_row_major_vs_tiled(local_twins: tuple[Artifact, Artifact]) -> None:
    art, tiled = local_twins
    for tp in (2, 4, 8):
        for s in rank_slices(art, tp, 1, "col"):
            t = tiled.index.tensors[s.tensor]
            if t.rows < 2 or s.col1 - s.col0 == t.row_bytes:
                continue
            row_major, tiles = requests_for(art, s), requests_for(tiled, s)
            assert tiles <= t.grid_rows < t.rows <= row_major, (s, row_major, tiles)
            result = load(tiled, [s])
            assert result.ledger.requests == tiles and np.array_equal(result.arrays[0], art.expected(s))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_arbitrary_rectangles_and_overlapping_requests(
    local_twins: tuple[Artifact, Artifact], data: st.DataObject
) -> None:
    art, tiled = local_twins
    slices = rectangles(data, tiled)
    batch = data.draw(st.sampled_from([4096, 64 << 10, 16 << 20]))
    gap, budget = data.draw(st.sampled_from([0, 4096])), data.draw(st.sampled_from([0.0, 0.02, 0.5]))
    result = load(
        tiled,
        slices,
        batch_bytes=batch,
        depth=data.draw(st.integers(1, 4)),
        page_cache=data.draw(st.booleans()),
        max_gap=gap,
        gap_budget=budget,
    )
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s))
    assert result.ledger.peak_staging_bytes <= result.ledger.staging_bound_bytes
    # the loader re-plans a batch's bands that are not in the page cache: whatever part that is, a read
    # holding a tiled band fits the bounce buffer the schedule (and the ledger's bound) allows
    plan = schedule_reads(
        slices, tiled.entries, tiled.files, tiled.index, batch_bytes=batch, max_gap=gap, gap_budget=budget
    )
    for batch_ in plan.batches:
        bands = [b for b in batch_.bands if data.draw(st.booleans())] or list(batch_.bands)
        fetch = plan_fetch(bands, max_gap=gap, gap_budget=budget)
        tiled_spans = [sp for sp in fetch.spans if any(bands[k].tile_width for k, _ in sp.members)]
        assert all(sp.length <= plan.bounce_bytes for sp in tiled_spans)
        assert all(bands[k].run_bytes <= plan.bounce_bytes for k in fetch.row_bands)


@pytest.mark.parametrize(
    "options",
    [{}, {"page_cache": False}, {"page_cache": False, "max_gap": 0}],
    ids=["mapped", "bounced", "runs"],
)
def test_flipped_byte_in_a_read_tile_names_the_tiles_file_range(
    tmp_path: Path, options: dict[str, bool | int]
) -> None:
    _, tiled = twins(tmp_path, str(tmp_path / "store"))
    name = "model.layers.0.self_attn.q_proj.weight"
    t = tiled.index.tensors[name]
    first = tile_pieces(t, 1, 2)[0][0]
    tiled.flip(first + 5)
    # tile (1, 2) in the second tile row of a stacked band (rows), of a three-tile-wide band (columns) and
    # of a one-tile-wide one (landing whole): checked in the mapping's copy, in the bounce buffer (a span,
    # or tile row by tile row), or where it landed
    rows = PlaneSlice(name, 0, t.rows // 2, 0, t.row_bytes)
    columns = PlaneSlice(name, 0, t.rows, 0, 3 * t.col_block)
    column = PlaneSlice(name, 0, t.rows, 2 * t.col_block, 3 * t.col_block)
    for s in (rows, columns, column):
        with pytest.raises(TileDigestMismatchError) as caught:
            load(tiled, [s], **options)
        err = caught.value
        assert (err.file, err.tensor, err.tile) == (TILED_FILE, name, (1, 2))
        assert err.byte_range == (first, first + tile_nbytes(t, 1, 2))
        assert str(first) in str(err)
    # a column slice that does not touch tile (1, 2) reads none of its bytes
    other = PlaneSlice(name, 0, t.rows, 0, t.col_block)
    result = load(tiled, [other])
    assert np.array_equal(result.arrays[0], tiled_expected(tiled, other))
    assert not result.ledger.touched(TILED_FILE, first + 5, 1)


def tiled_expected(tiled: Artifact, s: PlaneSlice) -> np.ndarray:
    """The slice, decoded from the tiled file itself."""
    t = tiled.index.tensors[s.tensor]
    region = np.frombuffer(tiled.raw, np.uint8, t.nbytes, t.start)
    matrix = from_tiled(region, t.rows, t.row_bytes, t.row_block, t.col_block).reshape(t.rows, t.row_bytes)
    return matrix[s.row0 : s.row1, s.col0 : s.col1]


@pytest.mark.s3
def test_s3_tiled_reads_requests_and_tamper_detection(moto_store_url: str, tmp_path: Path) -> None:
    art, tiled = twins(tmp_path, moto_store_url, hidden=128, kv=32, inter=256, vocab=64)
    bounded = 0
    for tp in (2, 4, 8):
        for axis in ("row", "col"):
            slices = rank_slices(art, tp, tp - 1, axis)
            result = load(tiled, slices)
            for s, got in zip(slices, result.arrays, strict=True):
                assert np.array_equal(got, art.expected(s)), s
            assert result.ledger.backend == "s3"
            if aligned(tiled, slices):  # column splits at tp 4, 8 of this small model cut tiles
                assert result.ledger.read_amplification <= 1.05
                bounded += 1
            limit = sum(tiled.index.tensors[s.tensor].grid_rows for s in slices)
            assert result.ledger.requests <= (len(slices) if axis == "row" else limit)
    assert bounded >= 4
    # a node's ranks splitting tile rows by columns: the interleaved runs are one request per region
    union = [s for rank in range(2) for s in rank_slices(art, 2, rank, "col")]
    node = load(tiled, union)
    for s, got in zip(union, node.arrays, strict=True):
        assert np.array_equal(got, art.expected(s)), s
    assert node.ledger.requests <= sum(t.grid_rows for t in tiled.index.tensors.values())
    assert node.ledger.read_amplification <= 1.05
    # a column slice of one tensor: at most a request per tile row tiled; row-major, a request per matrix
    # row where requests have no price, else its rows read whole in one request (bytes for requests)
    name = "model.layers.0.self_attn.q_proj.weight"
    t = tiled.index.tensors[name]
    s = next(s for s in rank_slices(art, 4, 1, "col") if s.tensor == name)
    want, got = load(art, [s], request_bytes=0), load(tiled, [s])
    assert np.array_equal(got.arrays[0], want.arrays[0])
    assert got.ledger.requests <= t.grid_rows < t.rows <= want.ledger.requests
    whole = load(art, [s])
    assert np.array_equal(whole.arrays[0], want.arrays[0])
    assert whole.ledger.requests == 1 and 3 < whole.ledger.read_amplification <= 4
    j = s.col0 // t.col_block  # the first tile the slice reads
    first = tile_pieces(t, 0, j)[0][0]
    tiled.flip(first)
    with pytest.raises(TileDigestMismatchError, match=name) as caught:
        load(tiled, [s])
    assert caught.value.tile == (0, j)
    assert caught.value.byte_range == (first, first + tile_nbytes(t, 0, j))
