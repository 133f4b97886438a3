"""Verified range reads: a rank's slices, read tile by tile, each tile checked before any byte is returned.

Pipeline per call of :func:`read_slices`:

1. *plan* (pure, :mod:`.schedule`): slices → covering tiles → bands (:mod:`.banding`; each band carries
   its landing, decided there: :mod:`.bands`) → batches with fetch plans; the tile index is first checked
   against the manifest's tensors and files;
2. *fetch* (:mod:`.runner` executes the plan, :mod:`.sources` read): ``depth`` batches in flight, one
   worker each. A batch whose fetch waited
   on the storage (a span not cached, a row not cached, any S3 fetch) hands its turn on before it is
   verified, so the next batch's fetch starts at once on one of ``verify_workers`` spare workers; a
   batch served from memory keeps its turn to the end (warm loads run ``depth`` batches at once, no
   more threads than before). Without spare workers, a cold node load's workers finished their reads
   together, then hashed together, and the disk stood idle 20-34% of the time. Locally, a band whose
   bytes are all in the page cache (other than one landing whole in its result array, which ``preadv``
   copies once either way) is copied out of a mapping of the blob in chunks of rows, each chunk
   hashed right after its copy while it is in the CPU cache (steps 2 and 3 fused; ``page_cache_bytes``
   in the ledger); the batch's other bands are read with ``preadv`` as follows (each batch's spans
   announced with ``POSIX_FADV_WILLNEED`` ``runner.PREFETCH_AHEAD x workers`` batches ahead, so the device
   keeps working without readahead past them). A *direct* band (all its tiles inside one slice) is read
   straight into that slice's preallocated result array, with no second copy; a *staged* band goes to
   the worker's reused, page-aligned staging slot (``mmap``). A span of at least
   :data:`~.bands.DIRECT_MIN` that is (almost) not cached is not announced but read with
   ``O_DIRECT`` (``ReadOptions.direct_io``): its whole pages straight into the result array (allocated
   at the band's offset within its file page, :func:`~.bands.direct_shifts`), a staging slot or the bounce
   buffer, with no page-cache insertion and no copy out of the page cache, the partial pages at its ends
   through the page cache; such bytes are not left in the page cache (ledger ``direct_bytes``).
   Row-major tensors are read as rectangles of their byte matrix; tensors in the ``shardport-tiled``
   layout as runs of whole tiles (a tile row's tiles are adjacent in the file), de-tiled into the band's
   rows, adjacent runs merged into one read;
3. *verify*: as soon as a batch's bytes are in, every tile is hashed chunk of rows by chunk of rows
   (streaming BLAKE3; a tile part not contiguous in its destination is first gathered into the worker's
   small scratch buffer) and compared with the tile index — tiles of the tiled layout that passed
   through the load's own memory as the file lays them out (a bounce buffer, an S3 response) were
   already hashed there, each contiguous, before being de-tiled (``runner._Checked``); a mismatch raises
   :class:`~shardport.registry.tiles.TileDigestMismatchError` (file, tensor, tile, byte range), the
   other workers stop, and no array is returned — a result array is handed on only after every tile
   of every slice verified;
4. *materialize*: staged bands are copied into the result arrays once verified — except a staged band
   whose tiles each lie inside one slice's part (a node's whole tile row split by columns among its
   ranks): copied from the page cache, its parts go from the mapping straight into the result arrays
   (no staging copy); read into staging, they are copied out chunk by chunk (one pass over the staged
   bytes, not two); either way its tiles are hashed in the result arrays, right after each chunk's copy.

Memory bound: the result arrays (exactly the assigned bytes) plus, per worker (``depth`` +
``verify_workers``, at most one per batch), the file
pages of the mapping group it copies from the page cache (nearby bands spanning at most ``batch_bytes``,
unmapped once its bands are done: shared page-cache pages, counted in RSS), a staging slot
(at most ``batch_bytes``, or the largest single tile if larger, each band rounded to pages; a staged
band of :data:`~.bands.DIRECT_MIN` or more starts at its offset within its file page: up to a page
more each), a scratch buffer
of the largest tile and, locally, for tiled tensors, a bounce buffer (at most a batch's band bytes
plus its bridged gaps: ``ReadSchedule.bounce_bytes``, plus a page for O_DIRECT's whole pages); plus a
64 KiB sink for bridged gaps locally. On
S3 each batch in flight also holds its responses (at most ``batch_bytes x (1 + gap_budget)``; a band
whose rows are read as one range to save requests counts its extent in the batch). The
ledger states the bound and the peak held.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy
from shardport.registry.tiles.model import TileIndex

from .ledger import FetchedRange, ReadLedger, StageSeconds, merge_ranges, paged_bytes
from .runner import _Runner
from .schedule import PlaneSlice, ReadSchedule, schedule_reads
from .sources import SINK_BYTES, BlobSource, anonymous, group_extent, map_groups, open_source

U8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Knobs of a load.

    ``depth`` (batches in flight, one worker each) None picks the store's ``profile.depth`` (CPU count 4..8
    locally, 4 on S3); ``verify_workers`` (spare workers: a batch whose fetch waited on the storage
    hands its turn to the next batch while one of them verifies it) None picks the CPU count, 0 makes
    each batch keep its turn to the end;
    ``max_gap`` None picks the store's ``profile.max_gap`` (4 KiB locally, 1 MiB on S3);
    ``request_bytes`` and ``max_amplification`` None pick the store's (0 locally; 1 MiB and 8 on S3: a
    row-major tensor's rows whose gaps cost less than a request are read as one range of at most 8x the
    bytes needed, :mod:`.ranges`);
    ``concurrency``: S3 requests in flight over all workers; ``record_ranges`` keeps the ranges read in the
    ledger;
    ``page_cache`` lets a local band whose bytes are all cached be copied from a mapping (False: always
    ``preadv``); ``direct_io`` reads a local span whose pages are (almost) all uncached with ``O_DIRECT``,
    straight into the result arrays (:data:`~.bands.DIRECT_MIN` and up; False: always through the page
    cache, which then holds the bytes for later loads); ``announce`` tells the kernel about each batch's
    spans ahead (``POSIX_FADV_WILLNEED``, :data:`~.runner.PREFETCH_AHEAD`; False: a batch's bytes are asked
    for only when its worker reads them, and what is cached when a batch starts is what was cached before);
    ``retry`` is the S3 range reads' :class:`~shardport.registry.store.retry.RetryPolicy` (None: the store's,
    by default 10 attempts, 50 ms base backoff; the ledger counts the ``retries``).
    """

    batch_bytes: int = 16 << 20
    depth: int | None = None
    verify_workers: int | None = None
    max_gap: int | None = None
    gap_budget: float = 0.02
    request_bytes: int | None = None
    max_amplification: float | None = None
    concurrency: int = 16
    record_ranges: bool = True
    page_cache: bool = True
    direct_io: bool = True
    announce: bool = True
    retry: RetryPolicy | None = None


@dataclass(frozen=True, slots=True)
class SliceRead:
    """Result of :func:`read_slices`: one verified array per requested slice, and the ledger."""

    arrays: tuple[U8Array, ...]
    ledger: ReadLedger


def read_slices(
    slices: Sequence[PlaneSlice],
    *,
    tensors: Iterable[TensorEntry],
    files: Iterable[FileEntry],
    index: TileIndex,
    store: Store,
    options: ReadOptions | None = None,
) -> SliceRead:
    """Read and verify ``slices`` from ``store`` (see the module docstring); raise on any mismatch."""
    opts = options or ReadOptions()
    files = tuple(files)
    start = time.perf_counter()
    profile = store.profile
    max_gap = opts.max_gap if opts.max_gap is not None else profile.max_gap
    request_bytes = opts.request_bytes if opts.request_bytes is not None else profile.request_bytes
    amplification = profile.max_amplification if opts.max_amplification is None else opts.max_amplification
    schedule = schedule_reads(
        slices,
        tensors,
        files,
        index,
        batch_bytes=opts.batch_bytes,
        max_gap=max_gap,
        gap_budget=opts.gap_budget,
        request_bytes=request_bytes,
        max_amplification=amplification,
    )
    planned = time.perf_counter()
    direct = opts.direct_io and store.profile.direct_io
    shifts = schedule.shifts if direct else {}
    outputs = [_result(s.shape, shifts.get(n)) for n, s in enumerate(schedule.slices)]
    depth = max(1, opts.depth or store.profile.depth)
    verify_workers = (os.cpu_count() or 1) if opts.verify_workers is None else max(0, opts.verify_workers)
    source = open_source(
        store,
        schedule.blobs,
        concurrency=max(1, opts.concurrency // depth),
        direct=direct,
        retry=opts.retry,
        sizes={f.path: f.size for f in files},
    )
    runner = _Runner(
        schedule,
        index,
        outputs,
        source,
        depth,
        verify_workers=verify_workers,
        page_cache=opts.page_cache,
        announce=opts.announce,
        map_limit=opts.batch_bytes,
        max_gap=max_gap,
        gap_budget=opts.gap_budget,
        request_bytes=request_bytes,
        max_amplification=amplification,
    )
    try:
        runner.run()
    finally:
        source.close()
    return SliceRead(tuple(outputs), _ledger(schedule, runner, source, opts, start, planned))


def _result(shape: tuple[int, int], shift: int | None) -> U8Array:
    """An uninitialized result array; with ``shift``, ``shift`` bytes into its own anonymous mapping.

    That mapping is advised for huge pages, as numpy's own large arrays are (:func:`~.sources.anonymous`).
    """
    if shift is None:
        return np.empty(shape, dtype=np.uint8)
    nbytes = shape[0] * shape[1]
    whole = np.frombuffer(anonymous(shift + nbytes, huge=True), dtype=np.uint8)
    return whole[shift : shift + nbytes].reshape(shape)


def _round_up(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


def _ledger(
    schedule: ReadSchedule,
    runner: _Runner,
    source: BlobSource,
    opts: ReadOptions,
    start: float,
    planned: float,
) -> ReadLedger:
    tiles, ranges, fetched_bytes = _reads(schedule, runner)
    per_batch = max((b.fetch.bytes for b in schedule.batches), default=0) if source.holds_responses else 0
    workers = runner.threads if schedule.batches else 0
    bound = workers * (max(schedule.slot_bytes, mmap.PAGESIZE) + per_batch)
    assigned = schedule.bytes_assigned
    fetched = merge_ranges(ranges) if opts.record_ranges else ()
    return ReadLedger(
        backend=source.kind,
        bytes_assigned=assigned,
        bytes_fetched=fetched_bytes,
        read_amplification=fetched_bytes / assigned if assigned else 1.0,
        requests=schedule.requests,
        tiles_verified=schedule.tiles,
        page_cache_batches=runner.cached_batches,
        page_cache_bytes=runner.cached_bytes,
        direct_bytes=source.direct_bytes,
        retries=source.retries,
        bytes_verified=sum(b.nbytes for batch in schedule.batches for b in batch.bands),
        peak_staging_bytes=runner.peak,
        staging_bound_bytes=bound,
        mapped_bound_bytes=workers * _largest_group(schedule, runner, opts.batch_bytes)
        if source.kind == "local" and opts.page_cache and schedule.batches
        else 0,
        scratch_bytes=workers * max(schedule.largest_tile, mmap.PAGESIZE)
        + (
            SINK_BYTES + workers * (_round_up(schedule.bounce_bytes) + mmap.PAGESIZE)
            if source.kind == "local"
            else 0
        ),
        seconds=StageSeconds(
            plan=planned - start,
            fetch=runner.seconds["fetch"],
            verify=runner.seconds["verify"],
            materialize=runner.seconds["materialize"],
            total=time.perf_counter() - start,
        ),
        tiles={name: tuple(sorted(v)) for name, v in tiles.items()},
        fetched=fetched,
        page_amplification=(paged_bytes(fetched, mmap.PAGESIZE) / assigned if assigned else 1.0)
        if opts.record_ranges
        else None,
    )


def _reads(schedule: ReadSchedule, runner: _Runner) -> tuple[dict[str, list[int]], list[FetchedRange], int]:
    """The tiles read per tensor, the ranges read and the bytes fetched (as the load read them)."""
    tiles: dict[str, list[int]] = {}
    ranges: list[FetchedRange] = []
    fetched_bytes = 0
    for number, batch in enumerate(schedule.batches):
        for band in batch.bands:
            cols = runner.index.tensors[band.tensor].grid_cols
            tiles.setdefault(band.tensor, []).extend(
                i * cols + j for i in range(band.i, band.i1) for j in range(band.j0, band.j1)
            )
        # what was read: the batch's plan, or for a mixed batch the bands copied from the page cache as
        # they lie plus the plan its other bands were read with (gaps bridged differently)
        fetch, members = runner.replanned.get(number, (batch.fetch, list(range(len(batch.bands)))))
        bands, read = [batch.bands[n] for n in members], set(members)
        cached = [b for n, b in enumerate(batch.bands) if n not in read]
        fetched_bytes += fetch.bytes + sum(b.nbytes for b in cached)
        ranges += [FetchedRange(s.file, s.offset, s.length) for s in fetch.spans]
        for b in [*cached, *(bands[k] for k in fetch.row_bands)]:
            ranges.append(FetchedRange(b.file, b.offset, b.run_bytes, b.stride, b.runs))
    return tiles, ranges, fetched_bytes


def _largest_group(schedule: ReadSchedule, runner: _Runner, limit: int) -> int:
    """The largest page-cache mapping a worker holds: a mapping group's extent, in whole pages."""
    return max(
        (
            _round_up(group_extent(batch.bands, group))
            for batch in schedule.batches
            for group in map_groups(
                batch.bands, limit, [n for n, b in enumerate(batch.bands) if runner.maps(b)]
            )
        ),
        default=0,
    )
