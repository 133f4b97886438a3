"""The runner: executes a :class:`~.schedule.ReadSchedule`, batch by batch, with bounded memory.

Every decision about a band was made in the plan (:mod:`.bands`: direct or staged, where it lands,
whether it may be mapped, whether it scatters into its parts, its tiles' rows and byte columns); the
runner binds those places to the load's buffers (the result arrays, a worker's staging slot), asks the
source for the bytes (:mod:`.sources`), hashes every tile and copies staged parts out. The pipeline,
its stages and the memory bound are described in :mod:`.read`.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardport.registry.tiles.model import TileIndex, check_tile, tile_hasher

from .bands import Band
from .errors import LoaderError
from .ranges import FetchPlan, plan_fetch
from .schedule import Batch, ReadSchedule
from .sources import BlobSource, Dest, anonymous, tile_columns

U8Array = npt.NDArray[np.uint8]
PART_BYTES = 256 << 10
"""Page-cache path: rows are copied (and hashed) so many at a time that each tile's part of them is about
this big: BLAKE3 needs inputs of ~128 KiB for full speed (4 KiB: a third of it), and a band's chunk
(rows x band width) stays within a core's L2 cache for the tiles' usual 1-8 tile columns."""
PREFETCH_AHEAD = 2
"""Cold reads: batches are announced (``POSIX_FADV_WILLNEED``) this many rounds of workers (``depth`` +
``verify_workers``, the batches that can be under way at once) ahead."""


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


@dataclass(slots=True)
class _Tally:
    """One batch under way: what it did so far.

    Its bands read through the storage (``cold``), those whose parts were filled straight from the
    source (``scattered``), bytes copied from the page cache, and seconds spent.
    """

    cold: list[int] = field(default_factory=list)
    scattered: set[int] = field(default_factory=set)
    cached_bytes: int = 0
    copied: float = 0.0
    hashed: float = 0.0
    moved: float = 0.0
    """Staged bytes copied out while verifying (materializing, timed apart)."""


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
        request_bytes: int = 0,
        max_amplification: float = 1.0,
    ) -> None:
        self.schedule, self.index, self.outputs, self.source = schedule, index, outputs, source
        self.page_cache, self.map_limit, self.announce = page_cache, map_limit, announce
        self.max_gap, self.gap_budget = max_gap, gap_budget
        self.request_bytes, self.max_amplification = request_bytes, max_amplification
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
        """Whether ``band`` is copied from a mapping when its pages are cached (:attr:`~.bands.Band.maps`)."""
        return self.page_cache and band.maps

    def _dest(self, band: Band, slot: int, worker: _Worker) -> Dest:
        """The band's planned place, in this load's buffers: its slice's result array, or a staging slot."""
        if band.direct < 0:
            return Dest(worker.staging, slot, band.width, band.rows, band.width)
        return Dest(self.flat[band.direct], band.at, band.pitch, band.rows, band.width)

    def _targets(self, band: Band) -> list[_Target]:
        """A scattering staged band's parts (:attr:`~.bands.Band.scatter`) as targets in the result arrays."""
        return [
            _Target(
                self.outputs[p.slice][
                    p.out_row : p.out_row + band.rows, p.out_col : p.out_col + p.col1 - p.col0
                ],
                p.col0,
                p.col1,
            )
            for p in sorted(band.parts, key=lambda p: p.col0)
        ]

    def _verify(
        self, band: Band, dest: Dest, worker: _Worker, src: U8Array | None = None
    ) -> tuple[float, float, bool]:
        """Hash ``band``'s tiles by chunks of rows; with ``src``, copy each chunk in first.

        ``src`` (mapped file bytes, page-cache path) is copied one chunk of rows at a time (each tile's
        part about :data:`PART_BYTES`) into ``dest`` — or, for a staged band that scatters
        (:attr:`~.bands.Band.scatter`), straight into the result arrays its parts go to, with no staging
        copy; while the chunk is in the CPU cache, each tile's part of it is fed to that tile's streaming
        hasher (through the worker's scratch buffer when the part is strided), so what is hashed is what
        we keep. Without ``src`` the tiles are hashed in ``dest``. A band of several tile rows is done
        tile row by tile row (no chunk crosses one), each row's tiles checked, in order, once complete.
        Returns (copy seconds, hash seconds, whether the parts were filled).
        """
        tiles = self.index.tensors[band.tensor]
        scattered = self._targets(band) if src is not None and band.scatter else None
        targets = scattered or [_Target(dest.array(), 0, dest.width)]
        places = []  # per tile: (the target array holding it, its columns there)
        for a, b in band.tile_byte_columns:
            tg = next(tg for tg in targets if tg.c0 <= a and b <= tg.c1)
            places.append((tg.array, a - tg.c0, b - tg.c0))
        step = max(1, PART_BYTES // max(1, min(c1 - c0 for _, c0, c1 in places)))
        copy = hashing = 0.0
        for i, t0, t1 in band.tile_rows():  # tile row by tile row; each row's tiles checked once complete
            hashers = [tile_hasher() for _ in places]
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
                for hasher, (rows, a, b) in zip(hashers, places, strict=True):
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
        """Fetch, verify and materialize batch ``number`` on a free worker, within a turn."""
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
            tally = _Tally()
            if not self._copy_cached(batch, dests, worker, tally):
                return
            t0 = time.perf_counter()
            checked = _Checked(self.index, [batch.bands[n] for n in tally.cold])
            if tally.cold and self._fetch(number, batch, dests, checked, tally.cold):
                self.turns.release()  # the storage was the wait: the next batch fetches while this
                turn = False  # one is verified (bounded by the spare workers)
            t1 = time.perf_counter()
            if not self._verify_fetched(batch, dests, worker, checked, tally):
                return
            t2 = time.perf_counter()
            t1 -= checked.seconds  # hashing done during the fetch counts as verifying
            self._account(0, cached=0 if tally.cold else 1, cached_bytes=tally.cached_bytes)
            self._materialize(batch, dests, tally.scattered)
            t3 = time.perf_counter()
            fetch, moved = tally.copied + t1 - t0, tally.moved
            self._account(0, fetch=fetch, verify=tally.hashed + t2 - t1 - moved, materialize=t3 - t2 + moved)
        finally:
            self._account(-held)
            self.workers.put(worker)
            if turn:
                self.turns.release()

    def _copy_cached(self, batch: Batch, dests: list[Dest], worker: _Worker, tally: _Tally) -> bool:
        """Copy (and hash) the batch's bands whose pages are all cached out of mappings; list the others.

        False when the load was stopped meanwhile.
        """
        mappable = [n for n, band in enumerate(batch.bands) if self.maps(band)]
        mapped = self.source.map_cached(batch.bands, self.map_limit, mappable) if mappable else None
        try:
            for n, (band, dest) in enumerate(zip(batch.bands, dests, strict=True)):
                src = mapped.arrays[n] if mapped is not None else None
                if src is None:
                    tally.cold.append(n)
                else:
                    if self.stop.is_set():
                        return False
                    tally.cached_bytes += band.nbytes  # cached: copy out of the mapping, hash as it lands
                    try:
                        c, h, filled = self._verify(band, dest, worker, src)
                    except BaseException as exc:  # its frames' locals would keep the mapping alive
                        traceback.clear_frames(exc.__traceback__)
                        src = None
                        raise
                    tally.copied, tally.hashed = tally.copied + c, tally.hashed + h
                    if filled:
                        tally.scattered.add(n)
                    del src
                if mapped is not None:
                    mapped.release(n)
        finally:
            if mapped is not None:
                mapped.close()
        return True

    def _fetch(
        self, number: int, batch: Batch, dests: list[Dest], checked: _Checked, cold: list[int]
    ) -> bool:
        """Read the ``cold`` bands through the storage: the batch's plan, or one for just these bands.

        Returns whether the fetch waited on the storage.
        """
        fetch = batch.fetch
        if len(cold) < len(batch.bands):
            fetch = plan_fetch(
                checked.bands,
                max_gap=self.max_gap,
                gap_budget=self.gap_budget,
                request_bytes=self.request_bytes,
                max_amplification=self.max_amplification,
            )
            with self.lock:
                self.replanned[number] = (fetch, cold)
        return self.source.fetch(fetch, checked.bands, [dests[n] for n in cold], checked)

    def _verify_fetched(
        self, batch: Batch, dests: list[Dest], worker: _Worker, checked: _Checked, tally: _Tally
    ) -> bool:
        """Hash the fetched bands' tiles not checked on arrival; False when the load was stopped."""
        for k, n in enumerate(tally.cold):
            if self.stop.is_set():
                return False
            if checked.complete(k):
                continue
            band = batch.bands[n]
            if band.scatter and not band.tile_width:
                # staged whole rows of several slices' parts: copied out part by part and hashed
                # there, chunk by chunk (one pass over the staged bytes instead of two)
                c, _, _ = self._verify(band, dests[n], worker, dests[n].array())
                tally.moved += c
                tally.scattered.add(n)
            else:  # hashed where it lands (gathered where tiles are strided)
                self._verify(band, dests[n], worker)
        return True

    def _materialize(self, batch: Batch, dests: list[Dest], scattered: set[int]) -> None:
        """Copy each verified staged band's parts into the result arrays (unless already scattered)."""
        for n, (band, dest) in enumerate(zip(batch.bands, dests, strict=True)):
            if band.parts and n not in scattered and not self.stop.is_set():
                rows = dest.array()
                for p in band.parts:
                    out = self.outputs[p.slice]
                    out[p.out_row : p.out_row + p.row1 - p.row0, p.out_col : p.out_col + p.col1 - p.col0] = (
                        rows[p.row0 : p.row1, p.col0 : p.col1]
                    )

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
