"""Verified range reads: a rank's slices, read tile by tile, each tile checked before any byte is returned.

Pipeline per call of :func:`read_slices`:

1. *plan* (pure, :mod:`.schedule`): slices → covering tiles → bands → batches with fetch plans; the tile
   index is first checked against the manifest's tensors and files;
2. *fetch* (:mod:`.sources`): ``depth`` batches in flight, one worker each. A batch whose fetch waited
   on the storage (a span not cached, a row not cached, any S3 fetch) hands its turn on before it is
   verified, so the next batch's fetch starts at once on one of ``verify_workers`` spare workers; a
   batch served from memory keeps its turn to the end (warm loads run ``depth`` batches at once, no
   more threads than before). Without spare workers, a cold node load's workers finished their reads
   together, then hashed together, and the disk stood idle 20-34% of the time. Locally, a band whose
   bytes are all in the page cache (other than one landing whole in its result array, which ``preadv``
   copies once either way) is copied out of a mapping of the blob in chunks of rows, each chunk
   hashed right after its copy while it is in the CPU cache (steps 2 and 3 fused; ``page_cache_bytes``
   in the ledger); the batch's other bands are read with ``preadv`` as follows (each batch's spans
   announced with ``POSIX_FADV_WILLNEED`` ``PREFETCH_AHEAD x workers`` batches ahead, so the device keeps
   working without readahead past them). A *direct* band (all its tiles inside one slice) is read
   straight into that slice's preallocated result array, with no second copy; a *staged* band goes to
   the worker's reused, page-aligned staging slot (``mmap``). A span of at least
   :data:`~.schedule.DIRECT_MIN` that is (almost) not cached is not announced but read with
   ``O_DIRECT`` (``ReadOptions.direct_io``): its whole pages straight into the result array (allocated
   at the band's offset within its file page, :func:`_direct_shifts`), a staging slot or the bounce
   buffer, with no page-cache insertion and no copy out of the page cache, the partial pages at its ends
   through the page cache; such bytes are not left in the page cache (ledger ``direct_bytes``).
   Row-major tensors are read as rectangles of their byte matrix; tensors in the ``shardport-tiled``
   layout as runs of whole tiles (a tile row's tiles are adjacent in the file), de-tiled into the band's
   rows, adjacent runs merged into one read;
3. *verify*: as soon as a batch's bytes are in, every tile is hashed chunk of rows by chunk of rows
   (streaming BLAKE3; a tile part not contiguous in its destination is first gathered into the worker's
   small scratch buffer) and compared with the tile index — tiles of the tiled layout that passed
   through the load's own memory as the file lays them out (a bounce buffer, an S3 response) were
   already hashed there, each contiguous, before being de-tiled (:class:`_Checked`); a mismatch raises
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
band of :data:`~.schedule.DIRECT_MIN` or more starts at its offset within its file page: up to a page
more each), a scratch buffer
of the largest tile and, locally, for tiled tensors, a bounce buffer (at most a batch's band bytes
plus its bridged gaps: ``ReadSchedule.bounce_bytes``, plus a page for O_DIRECT's whole pages); plus a
64 KiB sink for bridged gaps locally. On
S3 each batch in flight also holds its responses (at most ``batch_bytes x (1 + gap_budget)``). The
ledger states the bound and the peak held.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy
from shardport.registry.tiles.model import TileIndex, check_tile, tile_hasher

from .errors import LoaderError
from .ledger import FetchedRange, ReadLedger, StageSeconds, merge_ranges, paged_bytes
from .ranges import FetchPlan, plan_fetch
from .schedule import DIRECT_MIN, Band, Batch, PlaneSlice, ReadSchedule, schedule_reads
from .sources import (
    SINK_BYTES,
    BlobSource,
    Dest,
    anonymous,
    group_extent,
    lands_whole,
    map_groups,
    open_source,
    tile_columns,
)

U8Array = npt.NDArray[np.uint8]
PART_BYTES = 256 << 10
"""Page-cache path: rows are copied (and hashed) so many at a time that each tile's part of them is about
this big: BLAKE3 needs inputs of ~128 KiB for full speed (4 KiB: a third of it), and a band's chunk
(rows x band width) stays within a core's L2 cache for the tiles' usual 1-8 tile columns."""
PREFETCH_AHEAD = 2
"""Cold reads: batches are announced (``POSIX_FADV_WILLNEED``) this many rounds of workers (``depth`` +
``verify_workers``, the batches that can be under way at once) ahead."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Knobs of a load.

    ``depth`` (batches in flight, one worker each) None picks the store's ``profile.depth`` (CPU count 4..8
    locally, 4 on S3); ``verify_workers`` (spare workers: a batch whose fetch waited on the storage
    hands its turn to the next batch while one of them verifies it) None picks the CPU count, 0 makes
    each batch keep its turn to the end;
    ``max_gap`` None picks the store's ``profile.max_gap`` (4 KiB locally, 1 MiB on S3); ``concurrency``: S3
    requests in flight over all workers; ``record_ranges`` keeps the ranges read in the ledger;
    ``page_cache`` lets a local band whose bytes are all cached be copied from a mapping (False: always
    ``preadv``); ``direct_io`` reads a local span whose pages are (almost) all uncached with ``O_DIRECT``,
    straight into the result arrays (:data:`~.schedule.DIRECT_MIN` and up; False: always through the page
    cache, which then holds the bytes for later loads); ``announce`` tells the kernel about each batch's
    spans ahead (``POSIX_FADV_WILLNEED``, :data:`PREFETCH_AHEAD`; False: a batch's bytes are asked for
    only when its worker reads them, and what is cached when a batch starts is what was cached before);
    ``retry`` is the S3 range reads' :class:`~shardport.registry.store.retry.RetryPolicy` (None: the store's,
    by default 10 attempts, 50 ms base backoff; the ledger counts the ``retries``).
    """

    batch_bytes: int = 16 << 20
    depth: int | None = None
    verify_workers: int | None = None
    max_gap: int | None = None
    gap_budget: float = 0.02
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


@dataclass(frozen=True, slots=True)
class _Target:
    """Where byte columns ``[c0, c1)`` of a band go: ``array``, ``rows x (c1 - c0)`` (a view)."""

    array: U8Array
    c0: int
    c1: int


class _Worker:
    """Per-worker buffers: a staging slot and a scratch buffer for gathering strided tiles."""

    def __init__(self, slot_bytes: int, scratch_bytes: int) -> None:
        self.staging = memoryview(anonymous(slot_bytes))
        self.scratch = np.frombuffer(anonymous(scratch_bytes), dtype=np.uint8)


class _Checked:
    """A fetch's :data:`~.sources.TileCheck`: tiled bands' tiles hashed where they arrive.

    In the load's own memory as the file lays them out (each tile contiguous there), before they are
    de-tiled into their destinations. Counts the tile rows checked per band: a band all of whose tile
    rows were checked is not hashed again.
    """

    def __init__(self, index: TileIndex, bands: list[Band]) -> None:
        self.index, self.bands = index, bands
        self.rows = [0] * len(bands)
        self.seconds = 0.0

    def __call__(self, k: int, tiles: U8Array, q0: int) -> None:
        start = time.perf_counter()
        band = self.bands[k]
        grid = self.index.tensors[band.tensor]
        for q in range(tiles.shape[0]):
            for j in range(tiles.shape[1]):
                hasher = tile_hasher()
                hasher.update(tiles[q, j].reshape(-1).data)
                check_tile(grid, band.i + q0 + q, band.j0 + j, hasher.hexdigest(), tensor=band.tensor)
        self.rows[k] += tiles.shape[0]
        self.seconds += time.perf_counter() - start

    def complete(self, k: int) -> bool:
        """Whether every tile row of band ``k`` was checked."""
        band = self.bands[k]
        return bool(band.tile_width) and self.rows[k] == band.i1 - band.i


class _Runner:
    """Executes a schedule with a bounded number of batches (and buffers) in flight."""

    def __init__(
        self,
        schedule: ReadSchedule,
        index: TileIndex,
        outputs: list[U8Array],
        source: BlobSource,
        depth: int,
        *,
        verify_workers: int = 0,
        page_cache: bool = True,
        announce: bool = True,
        map_limit: int = 16 << 20,
        max_gap: int = 0,
        gap_budget: float = 0.0,
    ) -> None:
        self.schedule, self.index, self.outputs, self.source = schedule, index, outputs, source
        self.page_cache, self.map_limit, self.announce = page_cache, map_limit, announce
        self.max_gap, self.gap_budget = max_gap, gap_budget
        self.cached_batches = self.cached_bytes = 0
        self.flat = [out.reshape(-1).data for out in outputs]
        self.depth = depth
        self.threads = min(depth + verify_workers, max(1, len(schedule.batches)))
        self.turns = threading.Semaphore(depth)
        """``depth`` batches in flight; a batch whose fetch waited on the storage gives its turn back
        before it is verified, so that another batch's fetch starts meanwhile (on a spare worker)."""
        self.workers: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for _ in range(self.threads):
            self.workers.put(_Worker(schedule.slot_bytes, schedule.largest_tile))
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.seconds = {"fetch": 0.0, "verify": 0.0, "materialize": 0.0}
        self.held = self.peak = 0
        self.replanned: dict[int, tuple[FetchPlan, list[int]]] = {}
        """Per mixed batch (some bands served from the page cache): the plan its other bands were read
        with, and their indices."""

    def _account(self, delta: int, cached: int = 0, cached_bytes: int = 0, **seconds: float) -> None:
        with self.lock:
            self.cached_batches += cached
            self.cached_bytes += cached_bytes
            self.held += delta
            self.peak = max(self.peak, self.held)
            for stage, value in seconds.items():
                self.seconds[stage] += value

    def maps(self, band: Band) -> bool:
        """Whether ``band`` may be copied out of a mapping when its pages are cached.

        Not a direct band that lands whole in its slice's array (contiguous in the file and there, not
        de-tiled): ``preadv`` copies it once either way, and when it is not cached, mapping its extent
        and checking its pages only delays the read (in a cold row-split rank, ~9% of each worker's time).
        """
        return self.page_cache and (band.direct < 0 or not lands_whole(band, self._direct(band)))

    def _dest(self, band: Band, slot: int, worker: _Worker) -> Dest:
        if band.direct < 0:
            return Dest(worker.staging, slot, band.width, band.rows, band.width)
        return self._direct(band)

    def _direct(self, band: Band) -> Dest:
        """A direct band's place in its slice's result array."""
        at, width = _direct_at(self.schedule, band)
        return Dest(self.flat[band.direct], at, width, band.rows, band.width)

    def _tile_columns(self, band: Band) -> list[tuple[int, int]]:
        """Each tile's byte columns ``[a, b)`` within ``band``."""
        tiles = self.index.tensors[band.tensor]
        cb, row_bytes = tiles.col_block, tiles.row_bytes
        return [
            (j * cb - band.col0, min((j + 1) * cb, row_bytes) - band.col0) for j in range(band.j0, band.j1)
        ]

    def _scatter(self, band: Band, columns: Sequence[tuple[int, int]]) -> list[_Target] | None:
        """A staged band's parts as targets, or None.

        Only when each of its tiles (``columns``) lies inside exactly one part that spans all its rows
        (a node's whole tile row split by columns among its ranks).
        """
        parts = sorted(band.parts, key=lambda p: p.col0)
        if not parts or any(p.row0 != 0 or p.row1 != band.rows for p in parts):
            return None
        if any(a.col1 > b.col0 for a, b in pairwise(parts)):
            return None  # overlapping parts (a tile several slices take whole): copy once, then out
        if not all(any(p.col0 <= a and b <= p.col1 for p in parts) for a, b in columns):
            return None
        return [
            _Target(
                self.outputs[p.request][
                    p.out_row : p.out_row + band.rows, p.out_col : p.out_col + p.col1 - p.col0
                ],
                p.col0,
                p.col1,
            )
            for p in parts
        ]

    def _verify(
        self, band: Band, dest: Dest, worker: _Worker, src: U8Array | None = None
    ) -> tuple[float, float, bool]:
        """Hash ``band``'s tiles by chunks of rows; with ``src``, copy each chunk in first.

        ``src`` (mapped file bytes, page-cache path) is copied one chunk of rows at a time (each tile's
        part about :data:`PART_BYTES`) into ``dest`` — or, for a staged band whose parts allow it
        (:meth:`_scatter`), straight into the result arrays its parts go to, with no staging copy;
        while the chunk is in the CPU cache, each tile's part of it is fed to that tile's streaming
        hasher (through the worker's scratch buffer when the part is strided), so what is hashed is what
        we keep. Without ``src`` the tiles are hashed in ``dest``. A band of several tile rows is done
        tile row by tile row (no chunk crosses one), each row's tiles checked, in order, once complete.
        Returns (copy seconds, hash seconds, whether the parts were filled).
        """
        tiles = self.index.tensors[band.tensor]
        columns = self._tile_columns(band)
        scattered = self._scatter(band, columns) if src is not None and band.direct < 0 else None
        targets = scattered or [_Target(dest.array(), 0, dest.width)]
        spans = []  # per tile: (the target array holding it, its columns there)
        for a, b in columns:
            tg = next(tg for tg in targets if tg.c0 <= a and b <= tg.c1)
            spans.append((tg.array, a - tg.c0, b - tg.c0))
        step = max(1, PART_BYTES // max(1, min(c1 - c0 for _, c0, c1 in spans)))
        copy = hashing = 0.0
        for i in range(band.i, band.i1):  # tile row by tile row; each row's tiles checked once complete
            t0, t1 = i * tiles.row_block - band.row0, min((i + 1) * tiles.row_block, band.row1) - band.row0
            hashers = [tile_hasher() for _ in spans]
            for r in range(t0, t1, step):
                e = min(r + step, t1)
                start = time.perf_counter()
                if src is not None and not band.tile_width:
                    for tg in targets:  # item assignment releases the GIL (copyto did not)
                        tg.array[r:e] = src[r:e, tg.c0 : tg.c1]
                elif src is not None:  # de-tile: tile row i's tiles, rows r..e of each, side by side
                    tw, q = band.tile_width, i - band.i
                    for tg in targets:
                        run = src[q, tg.c0 // tw : tg.c1 // tw, r - t0 : e - t0]
                        tile_columns(tg.array[r:e], tw)[...] = run.transpose(1, 0, 2)
                copied = time.perf_counter()
                for hasher, (rows, a, b) in zip(hashers, spans, strict=True):
                    part = rows[r:e, a:b]
                    if not part.flags.c_contiguous:
                        gathered = worker.scratch[: part.size].reshape(part.shape)
                        gathered[...] = part
                        part = gathered
                    hasher.update(part.reshape(-1).data)
                copy, hashing = copy + copied - start, hashing + time.perf_counter() - copied
            for j, hasher in enumerate(hashers, start=band.j0):
                check_tile(tiles, i, j, hasher.hexdigest(), tensor=band.tensor)
        return copy, hashing, scattered is not None

    def _prefetch(self, batch: Batch) -> None:
        """Advisory only: a failure here (a missing blob, say) is reported by that batch's own read."""
        if not self.announce:
            return
        try:
            self.source.prefetch(batch.fetch, batch.bands)
        except (OSError, LoaderError):
            pass

    def _batch(self, number: int) -> None:
        if self.stop.is_set():
            return
        batch = self.schedule.batches[number]
        self.turns.acquire()
        turn = True
        worker = self.workers.get()
        held = batch.staging_bytes + (batch.fetch.bytes if self.source.holds_responses else 0)
        self._account(held)
        try:
            ahead = number + self.threads * PREFETCH_AHEAD  # announced this many rounds of batches ahead
            if ahead < len(self.schedule.batches):
                self._prefetch(self.schedule.batches[ahead])
            dests = [self._dest(b, s, worker) for b, s in zip(batch.bands, batch.slots, strict=True)]
            copied = hashed = 0.0
            cold = []  # bands read through the storage
            scattered = set()  # staged bands copied from the page cache straight into their parts
            cached_bytes = 0
            mappable = [n for n, band in enumerate(batch.bands) if self.maps(band)]
            mapped = self.source.map_cached(batch.bands, self.map_limit, mappable) if mappable else None
            try:
                for n, (band, dest) in enumerate(zip(batch.bands, dests, strict=True)):
                    src = mapped.arrays[n] if mapped is not None else None
                    if src is None:
                        cold.append(n)
                    else:
                        if self.stop.is_set():
                            return
                        cached_bytes += band.nbytes  # cached: copy out of the mapping, hash as it lands
                        try:
                            c, h, filled = self._verify(band, dest, worker, src)
                        except BaseException as exc:  # its frames' locals would keep the mapping alive
                            traceback.clear_frames(exc.__traceback__)
                            src = None
                            raise
                        copied, hashed = copied + c, hashed + h
                        if filled:
                            scattered.add(n)
                        del src
                    if mapped is not None:
                        mapped.release(n)
            finally:
                if mapped is not None:
                    mapped.close()
            t0 = time.perf_counter()
            checked = _Checked(self.index, [batch.bands[n] for n in cold])
            if cold:  # the rest through the storage: the batch's plan, or one for just these bands
                fetch = batch.fetch
                if len(cold) < len(batch.bands):
                    fetch = plan_fetch(checked.bands, max_gap=self.max_gap, gap_budget=self.gap_budget)
                    with self.lock:
                        self.replanned[number] = (fetch, cold)
                if self.source.fetch(fetch, checked.bands, [dests[n] for n in cold], checked):
                    self.turns.release()  # the storage was the wait: the next batch fetches while this
                    turn = False  # one is verified (bounded by the spare workers)
            t1 = time.perf_counter()
            moved = 0.0  # staged bytes copied out while verifying (materializing, timed apart)
            for k, n in enumerate(cold):
                if self.stop.is_set():
                    return
                if checked.complete(k):
                    continue
                band = batch.bands[n]
                if band.direct < 0 and not band.tile_width and self._scatter(band, self._tile_columns(band)):
                    # staged whole rows of several slices' parts: copied out part by part and hashed
                    # there, chunk by chunk (one pass over the staged bytes instead of two)
                    c, _, _ = self._verify(band, dests[n], worker, dests[n].array())
                    moved += c
                    scattered.add(n)
                else:  # hashed where it lands (gathered where tiles are strided)
                    self._verify(band, dests[n], worker)
            t2 = time.perf_counter()
            t1 -= checked.seconds  # hashing done during the fetch counts as verifying
            self._account(0, cached=0 if cold else 1, cached_bytes=cached_bytes)
            for n, (band, dest) in enumerate(zip(batch.bands, dests, strict=True)):
                if band.parts and n not in scattered and not self.stop.is_set():
                    rows = dest.array()
                    for p in band.parts:
                        out = self.outputs[p.request]
                        out[
                            p.out_row : p.out_row + p.row1 - p.row0, p.out_col : p.out_col + p.col1 - p.col0
                        ] = rows[p.row0 : p.row1, p.col0 : p.col1]
            t3 = time.perf_counter()
            self._account(
                0, fetch=copied + t1 - t0, verify=hashed + t2 - t1 - moved, materialize=t3 - t2 + moved
            )
        finally:
            self._account(-held)
            self.workers.put(worker)
            if turn:
                self.turns.release()

    def run(self) -> None:
        """Run every batch; on the first failure stop the others and raise it."""
        if not self.schedule.batches:
            return
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="shardport-read") as pool:
            for batch in self.schedule.batches[: self.threads * PREFETCH_AHEAD]:
                self._prefetch(batch)
            futures = [pool.submit(self._batch, k) for k in range(len(self.schedule.batches))]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # interrupted: queued batches are dropped, running ones stop early
                self.stop.set()
                for f in futures:
                    f.cancel()
                raise
            failed = [f for f in futures if f in done and f.exception() is not None]
            if failed:
                self.stop.set()
                for f in futures:
                    f.cancel()
                error = failed[0].exception()
                assert error is not None
                raise error


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
    start = time.perf_counter()
    max_gap = opts.max_gap if opts.max_gap is not None else store.profile.max_gap
    schedule = schedule_reads(
        slices,
        tensors,
        files,
        index,
        batch_bytes=opts.batch_bytes,
        max_gap=max_gap,
        gap_budget=opts.gap_budget,
    )
    planned = time.perf_counter()
    direct = opts.direct_io and store.profile.direct_io
    shifts = _direct_shifts(schedule) if direct else {}
    outputs = [_result(s.shape, shifts.get(n)) for n, s in enumerate(schedule.slices)]
    depth = max(1, opts.depth or store.profile.depth)
    verify_workers = (os.cpu_count() or 1) if opts.verify_workers is None else max(0, opts.verify_workers)
    source = open_source(
        store,
        schedule.blobs,
        concurrency=max(1, opts.concurrency // depth),
        direct=direct,
        retry=opts.retry,
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
    )
    try:
        runner.run()
    finally:
        source.close()
    return SliceRead(tuple(outputs), _ledger(schedule, runner, source, opts, start, planned))


def _direct_at(schedule: ReadSchedule, band: Band) -> tuple[int, int]:
    """A direct band's first byte in its slice's result array, and that array's row width."""
    width = schedule.slices[band.direct].shape[1]
    return band.out_row * width + band.out_col, width


def _direct_shifts(schedule: ReadSchedule) -> dict[int, int]:
    """Per slice with a large direct band landing whole in it: where in a page its result array starts.

    So that the band's whole file pages line up with pages of the array (O_DIRECT reads them there).
    """
    shifts: dict[int, int] = {}
    for batch in schedule.batches:
        for band in batch.bands:
            if band.direct < 0 or band.direct in shifts or band.nbytes < DIRECT_MIN:
                continue
            at, width = _direct_at(schedule, band)
            if lands_whole(band, Dest(memoryview(b""), at, width, band.rows, band.width)):
                shifts[band.direct] = (band.offset - at) % mmap.PAGESIZE
    return shifts


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
        mapped_bound_bytes=workers
        * max(
            (
                _round_up(group_extent(batch.bands, group))
                for batch in schedule.batches
                for group in map_groups(
                    batch.bands, opts.batch_bytes, [n for n, b in enumerate(batch.bands) if runner.maps(b)]
                )
            ),
            default=0,
        )
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
