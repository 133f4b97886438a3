"""Cold local reads with O_DIRECT: whole pages of uncached spans go straight into memory the load owns.

Real files on the test machine's disk, evicted from the page cache with ``POSIX_FADV_DONTNEED``; what is
cached is asked of the kernel (``cachestat``). Where the kernel cannot say what is cached, or the files
cannot be evicted (a tmpfs holds its files in the page cache), every read goes through the page cache
and the tests check that instead.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from loader_artifacts import Artifact, load, publish, rank_slices, tiled_copy, write_safetensors

from shardport.loader import schedule_reads
from shardport.loader.schedule import DIRECT_MIN
from shardport.loader.sources import LocalBlobSource, anonymous, cached_pages, direct_middle
from shardport.registry.tiles.errors import TileDigestMismatchError
from shardport.registry.tiles.model import tile_pieces

PAGE = mmap.PAGESIZE


def evict(path: str) -> None:
    """Drop ``path``'s pages from the page cache (written back first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached(path: str) -> int | None:
    """Bytes of ``path`` in the page cache (pages), or None where the kernel cannot say."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = cached_pages(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return None if pages is None else pages * PAGE


def blob_path(art: Artifact) -> str:
    return art.store.path(art.blob)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    """Tensors of 2-4 MiB: a rank's row piece of most of them holds more than ``DIRECT_MIN`` of pages."""
    root = tmp_path_factory.mktemp("direct")
    ckpt = write_safetensors(root / "ckpt", hidden=1024, inter=2048)
    return publish(ckpt, str(root / "store"), target=256 << 10, minimum=2 << 10)


@pytest.fixture(scope="module")
def big_tiled(big: Artifact, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("direct-tiled")
    return tiled_copy(big, root / "ckpt", str(root / "store"))


def test_cachestat_counts_what_is_cached(big: Artifact) -> None:
    path = blob_path(big)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.read()
    full = cached(path)
    if full is None:  # no cachestat here: nothing to count
        return
    assert full == -(-size // PAGE) * PAGE
    evict(path)
    assert cached(path) in (0, full)  # a disk file's clean pages leave; a tmpfs file's are the file


def test_direct_middle_is_the_whole_pages_inside_a_range() -> None:
    assert direct_middle(0, DIRECT_MIN) == (0, DIRECT_MIN)
    assert direct_middle(1, DIRECT_MIN + 2 * PAGE) == (PAGE, DIRECT_MIN + 2 * PAGE)
    assert direct_middle(1, DIRECT_MIN) is None  # one page short once both ends are cut
    assert direct_middle(PAGE - 1, DIRECT_MIN + 2) == (PAGE, DIRECT_MIN + PAGE)


@pytest.mark.parametrize("layout", ["row-major", "tiled"])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_a_cold_rank_reads_its_pages_directly_and_leaves_them_out_of_the_page_cache(
    big: Artifact, big_tiled: Artifact, layout: str, axis: str
) -> None:
    art = big if layout == "row-major" else big_tiled
    path = blob_path(art)
    slices = rank_slices(art, 2, 1, axis)
    evict(path)
    cold = cached(path) == 0  # else O_DIRECT is not expected (no cachestat, or pages that stay)
    result = load(art, slices)
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, big.expected(s))  # the source's bytes (the tiled copy holds them tiled)
    ledger = result.ledger
    if not cold:
        assert ledger.direct_bytes == 0
        return
    if layout == "row-major" and axis == "col":  # 2 KiB row pieces: page-cache reads, one per row
        assert ledger.direct_bytes == 0
        return
    # row pieces land whole in their arrays; tiled ones are read whole into a bounce buffer (a column
    # slice's tile row runs, one at a time, those of at least DIRECT_MIN) and de-tiled from there
    assert ledger.direct_bytes >= (ledger.bytes_assigned // 2 if axis == "row" else 1)
    schedule = schedule_reads(slices, art.entries, art.files, art.index)
    reads = sum(  # a tiled column slice's band is read run by run; any other band whole
        band.runs if band.tile_width and not band.contiguous else 1
        for batch in schedule.batches
        for band in batch.bands
    )
    left = cached(path)
    assert left is not None
    # what came through the page cache: bands too small for O_DIRECT, and the partial pages at band ends
    assert left <= ledger.bytes_assigned - min(ledger.direct_bytes, ledger.bytes_assigned) + 2 * PAGE * reads
    assert left < ledger.direct_bytes


def test_a_warm_blob_is_read_through_the_page_cache_and_direct_io_can_be_turned_off(big: Artifact) -> None:
    path = blob_path(big)
    slices = rank_slices(big, 2, 0, "row")
    evict(path)
    off = load(big, slices, direct_io=False)
    assert off.ledger.direct_bytes == 0
    after = cached(path)
    assert after is None or after >= off.ledger.bytes_assigned // 2  # the page cache holds them now
    warm = load(big, slices)
    assert warm.ledger.direct_bytes == 0  # cached: O_DIRECT would only read them again from the disk
    for s, a, b in zip(slices, off.arrays, warm.arrays, strict=True):
        assert np.array_equal(a, big.expected(s)) and np.array_equal(b, a)


def test_a_node_reading_column_slices_cold_stages_whole_rows_directly(big: Artifact) -> None:
    path = blob_path(big)
    union = [s for rank in range(4) for s in rank_slices(big, 4, rank, "col")]
    schedule = schedule_reads(union, big.entries, big.files, big.index)
    large = 0
    for batch in schedule.batches:  # large staged contiguous bands sit in their slots as in their pages
        for band, slot in zip(batch.bands, batch.slots, strict=True):
            if band.direct < 0 and band.contiguous and band.nbytes >= DIRECT_MIN:
                assert slot % PAGE == band.offset % PAGE
                assert slot + band.nbytes <= batch.staging_bytes
                large += 1
    assert large > 0
    evict(path)
    cold = cached(path) == 0
    result = load(big, union)
    for s, got in zip(union, result.arrays, strict=True):
        assert np.array_equal(got, big.expected(s))
    assert (result.ledger.direct_bytes >= result.ledger.bytes_assigned // 2) == cold
    assert result.ledger.peak_staging_bytes <= result.ledger.staging_bound_bytes


@pytest.mark.parametrize(
    ("layout", "axis", "who"),
    [("row-major", "row", "rank"), ("row-major", "col", "node"), ("tiled", "row", "rank")],
)
def test_a_byte_flipped_in_a_page_read_directly_is_caught(
    tmp_path: Path, layout: str, axis: str, who: str
) -> None:
    source = publish(write_safetensors(tmp_path / "ckpt", hidden=1024, inter=2048), str(tmp_path / "store"))
    art = source
    if layout == "tiled":
        art = tiled_copy(source, tmp_path / "tiled", str(tmp_path / "tiled-store"))
    name = "model.layers.0.mlp.up_proj.weight"
    tiles = art.index.tensors[name]
    slices = (
        rank_slices(art, 2, 0, axis)
        if who == "rank"
        else [s for rank in range(2) for s in rank_slices(art, 2, rank, axis)]
    )
    # a byte in the middle of a tile in the middle of rank 0's rows of the tensor: a page read directly
    piece = next(s for s in slices if s.tensor == name)
    i = (piece.row0 + piece.row1) // 2 // tiles.row_block
    pieces = tile_pieces(tiles, i, 0)  # per tile row in the row-major layout, one run in the tiled one
    offset, length = pieces[len(pieces) // 2]
    art.flip(offset + length // 2)
    evict(blob_path(art))
    with pytest.raises(TileDigestMismatchError) as caught:
        load(art, slices)
    assert (caught.value.tensor, caught.value.tile) == (name, (i, 0))
    evict(blob_path(art))
    untouched = [s for s in slices if s.tensor != name]
    result = load(art, untouched)  # the rest of the blob still reads (and verifies) cold
    for s, got in zip(untouched, result.arrays, strict=True):
        assert np.array_equal(got, source.expected(s))


def test_an_o_direct_read_the_file_system_refuses_falls_back_to_the_page_cache(big: Artifact) -> None:
    source = LocalBlobSource(big.store, {big.file: big.files[0].digest}, direct=True)
    try:
        fd = source._direct_fd(big.file)
        if fd is None:  # this file system takes no O_DIRECT at all: nothing to refuse
            return
        buf = anonymous(2 * DIRECT_MIN)
        view = memoryview(buf)[1 : 1 + DIRECT_MIN]  # memory off the page grid: O_DIRECT refuses (EINVAL)
        assert source._read_direct(fd, view, 0, big.file, DIRECT_MIN) is False
        assert source.direct_bytes == 0 and source._direct_fd(big.file) is None  # not asked again
        aligned = memoryview(buf)[:DIRECT_MIN]
        assert source._read_direct(fd, aligned, 0, big.file, DIRECT_MIN) is True  # the descriptor still works
        assert bytes(aligned) == big.raw[:DIRECT_MIN]
    finally:
        source.close()
    evict(blob_path(big))
    slices = rank_slices(big, 2, 0, "row")
    result = load(big, slices)  # a new source: O_DIRECT again where the disk takes it
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, big.expected(s))
