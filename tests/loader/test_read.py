"""Verified range reads of real safetensors and GGUF (Q4_1) files, on a local store and on moto S3."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_artifacts import Artifact, load, publish, rank_slices, rectangles, write_gguf, write_safetensors

from shardport.loader import (
    BlobNotFoundError,
    IndexMismatchError,
    PlaneSlice,
    SliceRequestError,
    read_slices,
    schedule_reads,
)
from shardport.loader.ranges import FetchPlan, plan_fetch
from shardport.loader.schedule import Band
from shardport.registry.artifact.manifest import FileEntry
from shardport.registry.errors import DigestMismatchError
from shardport.registry.store.keys import blob_key
from shardport.registry.tiles.errors import TileDigestMismatchError
from shardport.registry.tiles.model import TensorTiles, tile_pieces


@pytest.fixture(scope="module")
def st_art(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("st")
    return publish(write_safetensors(root / "ckpt"), str(root / "store"), minimum=2 << 10)


@pytest.fixture(scope="module")
def gguf_art(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("gguf")
    return publish(write_gguf(root / "ckpt"), str(root / "store"), minimum=2 << 10)


@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_splits_return_source_bytes_with_amplification_at_most_1_05(
    fmt: str, axis: str, tp: int, page_cache: bool, st_art: Artifact, gguf_art: Artifact
) -> None:
    art = st_art if fmt == "safetensors" else gguf_art
    pieces: dict[str, list[np.ndarray]] = {}
    for rank in range(tp):
        slices = rank_slices(art, tp, rank, axis)
        result = load(art, slices, page_cache=page_cache)
        # the blob was just written, so it is in the page cache and the mapped path serves (nearly) all of
        # a column split (a VM's proactive reclaim may take a page now and then: that band goes through
        # preadv); a row split's bands land whole in the arrays and are read with preadv, cached or not
        if page_cache and axis == "col":
            assert result.ledger.page_cache_bytes >= result.ledger.bytes_verified // 2
        else:
            assert result.ledger.page_cache_bytes == 0 and result.ledger.page_cache_batches == 0
        for s, got in zip(slices, result.arrays, strict=True):
            assert got.shape == s.shape and got.dtype == np.uint8
            assert np.array_equal(got, art.expected(s)), s
            pieces.setdefault(s.tensor, []).append(got)
        ledger = result.ledger
        assert ledger.bytes_assigned == sum(s.nbytes for s in slices)
        assert ledger.read_amplification <= 1.05, ledger
        assert ledger.bytes_verified <= ledger.bytes_fetched
        assert ledger.peak_staging_bytes == 0  # aligned slices are read straight into their arrays
    for e in art.entries:  # the ranks' slices put back together are the whole tensor
        if len(e.shape) >= 2:
            whole = np.concatenate(pieces[e.name], axis=0 if axis == "row" else 1)
            assert np.array_equal(whole, art.matrix(e.name))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_arbitrary_rectangles_and_overlapping_requests(st_art: Artifact, data: st.DataObject) -> None:
    slices = rectangles(data, st_art)
    batch = data.draw(st.sampled_from([4096, 64 << 10, 16 << 20]))
    result = load(
        st_art,
        slices,
        batch_bytes=batch,
        depth=data.draw(st.integers(1, 4)),
        verify_workers=data.draw(st.integers(0, 3)),
        page_cache=data.draw(st.booleans()),
    )
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, st_art.expected(s))
    assert result.ledger.peak_staging_bytes <= result.ledger.staging_bound_bytes


def test_unaligned_slices_are_staged_within_the_bound(st_art: Artifact) -> None:
    slices = [  # every slice cuts tiles at its edges, so those tiles are staged, verified, then copied
        PlaneSlice(s.tensor, s.row0 + 1, s.row1 - 1, s.col0, s.col1)
        for s in rank_slices(st_art, 2, 0, "row")
        if s.row1 - s.row0 > 2
    ]
    result = load(st_art, slices, batch_bytes=64 << 10, depth=2, verify_workers=1)
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, st_art.expected(s))
    ledger = result.ledger
    largest = max(t.row_block * min(t.col_block, t.row_bytes) for t in st_art.index.tensors.values())
    assert 0 < ledger.peak_staging_bytes <= ledger.staging_bound_bytes <= 3 * max(64 << 10, largest)
    assert ledger.read_amplification > 1  # the cut tiles are read whole
    assert ledger.tiles_verified == sum(len(v) for v in ledger.tiles.values())
    assert set(ledger.to_json()) >= {"bytes_assigned", "bytes_fetched", "read_amplification", "requests"}


def _tile_offset(tiles: TensorTiles, i: int, j: int) -> int:
    return tile_pieces(tiles, i, j)[0][0]


@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
def test_flipped_byte_in_a_read_tile_is_detected(tmp_path: Path, page_cache: bool) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    name = "model.layers.0.self_attn.q_proj.weight"
    tiles = art.index.tensors[name]
    at = _tile_offset(tiles, 1, 2) + 5
    art.flip(at)
    with pytest.raises(TileDigestMismatchError) as caught:
        load(art, [PlaneSlice(name, 0, tiles.rows // 2, 0, tiles.row_bytes)], page_cache=page_cache)
    err = caught.value
    blob = art.store.path(art.blob)  # the error (alive here, traceback and all) holds no mapping of it
    assert blob not in Path("/proc/self/maps").read_text()
    assert isinstance(err, DigestMismatchError)
    assert (err.file, err.tensor, err.tile) == (art.file, name, (1, 2))
    assert err.byte_range[0] <= at < err.byte_range[1]
    for text in (art.file, name, "(1, 2)", str(err.byte_range[0])):
        assert text in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
def test_flipped_byte_in_a_node_read_of_column_slices_is_detected(tmp_path: Path, page_cache: bool) -> None:
    # whole tile rows split by columns among the ranks: from the page cache the parts go straight into
    # the ranks' arrays and the tiles are hashed there; the flip must still be caught
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    name = "model.layers.0.self_attn.q_proj.weight"
    tiles = art.index.tensors[name]
    assert tiles.grid_cols >= 4
    at = _tile_offset(tiles, 1, tiles.grid_cols - 1) + 3
    art.flip(at)
    union = [s for rank in range(4) for s in rank_slices(art, 4, rank, "col")]
    with pytest.raises(TileDigestMismatchError) as caught:
        load(art, union, page_cache=page_cache)
    assert (caught.value.tensor, caught.value.tile) == (name, (1, tiles.grid_cols - 1))


def test_evicted_blob_is_read_with_preadv_then_served_from_the_page_cache(tmp_path: Path) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    blob = art.store.path(blob_key(art.files[0].digest))
    fd = os.open(blob, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages of a disk file leave the cache
    finally:
        os.close(fd)
    slices = rank_slices(art, 2, 1, "col")
    cold = load(art, slices)
    assert cold.ledger.page_cache_batches == 0  # nothing cached: every batch went through preadv
    warm = load(art, slices)  # the rank's pages are cached now (exact ranges, page-rounded)
    assert warm.ledger.page_cache_bytes >= warm.ledger.bytes_verified // 2
    fd = os.open(blob, os.O_RDONLY)
    try:  # evict the first half again: its bands go through preadv, the rest still comes from the cache
        os.posix_fadvise(fd, 0, art.files[0].size // 2, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    mixed = load(art, slices, batch_bytes=16 << 20)
    assert 0 < mixed.ledger.page_cache_bytes < mixed.ledger.bytes_verified
    for s, a, b, c in zip(slices, cold.arrays, warm.arrays, mixed.arrays, strict=True):
        assert np.array_equal(a, art.expected(s)) and np.array_equal(b, a) and np.array_equal(c, a)


def _runs(ranges: list[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
    """(offset, length, stride, count) records as merged [start, end) byte intervals."""
    out: list[list[int]] = []
    for a, b in sorted((o + q * step, o + q * step + n) for o, n, step, c in ranges for q in range(c)):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(wanted: list[tuple[int, int]], have: list[tuple[int, int]]) -> bool:
    return all(any(lo <= a and b <= hi for lo, hi in have) for a, b in wanted)


def test_a_batch_partly_served_from_the_page_cache_accounts_for_what_its_own_plan_read(
    tmp_path: Path,
) -> None:
    art = publish(
        write_safetensors(tmp_path / "ckpt", hidden=1024, inter=2048),
        str(tmp_path / "store"),
        target=1 << 20,
        minimum=4 << 10,
    )
    slices = rank_slices(art, 2, 0, "col")
    knobs = {"batch_bytes": 1551007, "max_gap": 4096, "gap_budget": 0.5}
    schedule = schedule_reads(slices, art.entries, art.files, art.index, **knobs)  # type: ignore[arg-type]
    batch = schedule.batches[4]  # two strided up_proj bands and a k_proj one
    served, rest = batch.bands[0], list(batch.bands[1:])
    replan = plan_fetch(rest, max_gap=4096, gap_budget=0.5)

    def records(fetch: FetchPlan, bands: list[Band]) -> list[tuple[int, int, int, int]]:
        rows = [
            (bands[k].offset, bands[k].run_bytes, bands[k].stride, bands[k].runs) for k in fetch.row_bands
        ]
        return [(s.offset, s.length, 0, 1) for s in fetch.spans] + rows

    whole = [
        *records(batch.fetch, list(batch.bands)),
        (served.offset, served.run_bytes, served.stride, served.runs),
    ]
    # the case at hand: planned for its cold bands alone, the batch bridges gaps its own plan did not
    assert not _covered(_runs(records(replan, rest)), _runs(whole))
    blob = art.store.path(art.blob)
    for _ in range(3):  # a VM's proactive reclaim may take one of the warmed pages: warm again
        fd = os.open(blob, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead into the next band
            for q in range(served.runs):  # only the first band's rows come back into the page cache
                os.pread(fd, served.run_bytes, served.offset + q * served.stride)
        finally:
            os.close(fd)
        # nothing announced ahead (it would bring the other bands in first), one batch at a time
        result = load(art, slices, **knobs, announce=False, depth=1)
        if result.ledger.page_cache_bytes == served.nbytes:
            break
    ledger = result.ledger
    assert ledger.page_cache_bytes == served.nbytes  # that band came from the page cache, the rest did not
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s))
    fetched = _runs([(r.offset, r.length, r.stride, r.count) for r in ledger.fetched])
    assert _covered(_runs(records(replan, rest)), fetched)  # the ledger names what was actually read
    others = sum(b.fetch.bytes for n, b in enumerate(schedule.batches) if n != 4)
    assert ledger.bytes_fetched == others + served.nbytes + replan.bytes


@pytest.mark.parametrize("batch", [4096, 64 << 10, 16 << 20])
def test_node_read_of_column_slices_reads_whole_rows_within_the_batch_bound(
    st_art: Artifact, batch: int
) -> None:
    union = [s for rank in range(4) for s in rank_slices(st_art, 4, rank, "col")]
    schedule = schedule_reads(union, st_art.entries, st_art.files, st_art.index, batch_bytes=batch)
    largest = max(t.row_block * min(t.col_block, t.row_bytes) for t in st_art.index.tensors.values())
    bands = [b for batch_ in schedule.batches for b in batch_.bands]
    assert max(b.nbytes for b in bands) <= max(batch, largest)  # whole rows, cut to the batch size
    result = load(st_art, union, batch_bytes=batch)
    for s, got in zip(union, result.arrays, strict=True):
        assert np.array_equal(got, st_art.expected(s))
    assert result.ledger.read_amplification <= 1.0  # replicated 1-D tensors are read once for all
    assert result.ledger.page_amplification is not None and result.ledger.page_amplification <= 1.05
    if batch == 16 << 20:  # one rank alone reads its column pieces: the device reads their whole pages
        alone = load(st_art, rank_slices(st_art, 4, 1, "col"))
        assert alone.ledger.page_amplification is not None and alone.ledger.page_amplification > 1.5
        assert result.ledger.requests < 4 * alone.ledger.requests


@pytest.mark.parametrize("page_cache", [True, False], ids=["mapped", "preadv"])
@pytest.mark.parametrize("who", ["rank", "node"])
def test_tile_rows_planned_alike_are_one_band_checked_tile_row_by_tile_row(
    tmp_path: Path, page_cache: bool, who: str
) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    name = "model.layers.0.mlp.down_proj.weight"
    tiles = art.index.tensors[name]
    assert tiles.grid_rows >= 4 and tiles.grid_cols >= 2
    half = tiles.row_bytes // 2
    if who == "rank":  # one column half: whole tile rows of it go to one slice
        slices = [PlaneSlice(name, 0, tiles.rows, half, tiles.row_bytes)]
    else:  # both halves read together: whole rows, staged, each half a part
        slices = [PlaneSlice(name, 0, tiles.rows, c, c + half) for c in (0, half)]
    limit = 2 * tiles.row_block * tiles.row_bytes  # two tile rows of whole matrix rows per band at most
    schedule = schedule_reads(slices, art.entries, art.files, art.index, batch_bytes=limit)
    bands = [b for batch in schedule.batches for b in batch.bands]
    assert max(b.i1 - b.i for b in bands) == 2  # stacked, and no further than the limit allows
    assert all(b.extent <= limit for b in bands)
    assert schedule.tiles == tiles.grid_rows * (tiles.grid_cols // (2 if who == "rank" else 1))
    result = load(art, slices, batch_bytes=limit, page_cache=page_cache)
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s))
    listed = result.ledger.tiles[name]
    assert len(listed) == len(set(listed)) == schedule.tiles
    stacked = next(b for b in bands if b.i1 - b.i == 2)
    at = _tile_offset(tiles, stacked.i + 1, stacked.j1 - 1) + 7  # the band's second tile row, last tile
    art.flip(at)
    with pytest.raises(TileDigestMismatchError) as caught:
        load(art, slices, batch_bytes=limit, page_cache=page_cache)
    assert caught.value.tile == (stacked.i + 1, stacked.j1 - 1)
    assert caught.value.byte_range[0] <= at < caught.value.byte_range[1]


def test_a_blob_that_cannot_be_mapped_is_read_with_preadv(
    st_art: Artifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mmap as stdlib_mmap

    from shardport.loader.sources import local

    real = stdlib_mmap.mmap

    def refuse(fileno: int, length: int, *args: object, **kwargs: object) -> stdlib_mmap.mmap:
        if fileno != -1:  # file mappings fail as on a file system without mmap (ENODEV)
            raise OSError(19, "No such device")
        return real(fileno, length, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(local.mmap, "mmap", refuse)
    slices = rank_slices(st_art, 2, 1, "row")
    result = load(st_art, slices)
    assert result.ledger.page_cache_bytes == 0
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, st_art.expected(s))


def test_flipped_byte_in_an_unread_tile_is_never_touched(tmp_path: Path) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    name = "model.layers.0.self_attn.o_proj.weight"
    tiles = art.index.tensors[name]
    i, j = tiles.grid_rows - 1, tiles.grid_cols - 1
    at = _tile_offset(tiles, i, j) + 3
    art.flip(at)
    slices = [PlaneSlice(name, 0, tiles.rows, 0, tiles.row_bytes // 2)]  # column half 0 of 2
    result = load(art, slices)
    assert np.array_equal(result.arrays[0], art.expected(slices[0]))
    assert not result.ledger.touched(art.file, at, 1)
    assert i * tiles.grid_cols + j not in result.ledger.tiles[name]
    with pytest.raises(TileDigestMismatchError):
        load(art, [PlaneSlice(name, tiles.rows - 1, tiles.rows, tiles.row_bytes - 2, tiles.row_bytes)])


def test_request_and_index_errors(st_art: Artifact, tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    t = st_art.index.tensors[name]
    with pytest.raises(SliceRequestError, match="not in the manifest"):
        load(st_art, [PlaneSlice("nope", 0, 1, 0, 1)])
    with pytest.raises(SliceRequestError, match="outside"):
        load(st_art, [PlaneSlice(name, 0, t.rows + 1, 0, 2)])
    moved = st_art.index.model_copy(
        update={"tensors": {**st_art.index.tensors, name: t.model_copy(update={"start": 0})}}
    )
    with pytest.raises(IndexMismatchError, match=name):
        read_slices(
            [PlaneSlice(name, 0, 1, 0, 2)],
            tensors=st_art.entries,
            files=st_art.files,
            index=moved,
            store=st_art.store,
        )
    relaid = [  # the manifest says tiled, the index row-major: a disagreement, named before any read
        e.model_copy(update={"layout": "shardport-tiled", "tile_rows": t.row_block, "tile_cols": t.col_block})
        if e.name == name
        else e
        for e in st_art.entries
    ]
    with pytest.raises(IndexMismatchError, match="stores it tiled"):
        read_slices(
            [PlaneSlice(name, 0, 1, 0, 2)],
            tensors=relaid,
            files=st_art.files,
            index=st_art.index,
            store=st_art.store,
        )
    missing = [FileEntry(path=st_art.file, size=st_art.files[0].size, digest="sha256:" + "0" * 64)]
    with pytest.raises(BlobNotFoundError, match=st_art.file):
        read_slices(
            [PlaneSlice(name, 0, 1, 0, 2)],
            tensors=st_art.entries,
            files=missing,
            index=st_art.index,
            store=st_art.store,
        )
    empty = load(st_art, [PlaneSlice(name, 3, 3, 0, 0)])
    assert empty.arrays[0].shape == (0, 0) and empty.ledger.requests == 0


@pytest.mark.s3
def test_s3_splits_and_tamper_detection(moto_store_url: str, tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    art = publish(path, moto_store_url, target=8 << 10, minimum=512)
    for rank in range(4):
        slices = rank_slices(art, 4, rank, "row")
        result = load(art, slices)
        for s, got in zip(slices, result.arrays, strict=True):
            assert np.array_equal(got, art.expected(s))
        assert result.ledger.backend == "s3"
        assert result.ledger.read_amplification <= 1.05
        assert result.ledger.requests <= 2 * len(slices)
    # a column split of a row-major tensor costs a request per row on S3 with requests unpriced (keep it
    # to one small tensor); priced (the S3 profile), its rows are read whole in a request or two
    cols = [s for s in rank_slices(art, 4, 1, "col") if s.tensor.endswith("q_proj.weight")]
    for options, requests, amplification in (({"request_bytes": 0}, 128, 1.05), ({}, 2, 4.0)):
        result = load(art, cols, **options)
        assert np.array_equal(result.arrays[0], art.expected(cols[0]))
        assert result.ledger.requests <= requests and result.ledger.read_amplification <= amplification
    name = "model.layers.0.self_attn.q_proj.weight"
    tiles = art.index.tensors[name]
    art.flip(_tile_offset(tiles, 0, 0))
    with pytest.raises(TileDigestMismatchError, match=name):
        load(art, rank_slices(art, 4, 0, "row"))
    result = load(art, [s for s in rank_slices(art, 4, 3, "row") if s.tensor == name])
    assert not result.ledger.touched(art.file, _tile_offset(tiles, 0, 0), 1)


def test_mapped_bound_covers_a_mapped_band_batched_after_one_read_whole(st_art: Artifact) -> None:
    # a tile row of the first matrix lands whole in its array (read with preadv, never mapped); a later
    # matrix's tile column is mapped from the page cache in the same batch: the bound covers its extent
    first, later = [e for e in sorted(st_art.entries, key=lambda e: e.start) if len(e.shape) == 2][:2]
    a, b = st_art.index.tensors[first.name], st_art.index.tensors[later.name]
    slices = [
        PlaneSlice(first.name, 0, a.row_block, 0, a.row_bytes),
        PlaneSlice(later.name, 0, b.rows, 0, b.col_block),
    ]
    result = load(st_art, slices, depth=1)
    assert len(result.ledger.tiles) == 2
    assert result.ledger.page_cache_bytes == b.rows * b.col_block  # only the column was mapped
    assert result.ledger.mapped_bound_bytes >= (b.rows - 1) * b.row_bytes + b.col_block
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, st_art.expected(s))
