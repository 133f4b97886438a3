"""Blob sources: execute a batch's fetch plan into its bands' destinations, locally or over S3.

A :class:`Dest` is where a band's bytes go: ``rows`` rows of ``width`` bytes, ``stride`` apart, in a
writable buffer (a slice's result array for a direct band, a page-aligned staging slot otherwise). The
band's bytes come from its file geometry (``origin``, file ``stride``; :class:`~.schedule.Band`): a
row-major rectangle, or a tiled tensor's tile rows, each a run of its tiles (:func:`file_view`), which
:func:`place` de-tiles into the destination's rows.

Local (:class:`LocalBlobSource`): one ``os.preadv`` per span scatters the file bytes straight into the
destinations (bridged gap bytes land in a scratch page), at most ``IOV_MAX`` buffers per call; a band
read row by row costs one ``preadv`` per row. A span holding a tiled band is read whole into the
thread's bounce buffer and de-tiled from there (a tiled band read run by run: each run likewise). Each
blob is opened once with ``POSIX_FADV_RANDOM`` so kernel readahead reads nothing nobody asked for. When
a band's bytes are all in the page cache (``mincore`` over the pages its rows touch), the runner instead
copies it out of a read-only mapping of its batch's extents (:meth:`LocalBlobSource.map_cached`, one
mapping per run of nearby bands) chunk by chunk into memory it owns and hashes it there, while the chunk
is still in the CPU cache (a warm strided band costs one strided copy instead of a ``preadv`` per row);
each group is unmapped once its bands are done, so the page cache keeps the pages and the mapped file
pages touched at once stay within one group per worker.

S3 (:class:`S3BlobSource`): spans and runs become ``cat_ranges`` requests, at most ``concurrency`` at a
time, and the responses are copied (de-tiled for tiled bands) into the destinations. Storage errors are
wrapped once here, naming the file, its blob and the byte range.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shardport.registry.errors import NotFoundError, StoreError, StoreObjectError
from shardport.registry.libc import libc_function
from shardport.registry.retry import RetryPolicy
from shardport.registry.store import Store, blob_key

from .errors import BlobNotFoundError, RangeReadError
from .ranges import FetchPlan, Span
from .schedule import DIRECT_MIN, Band

try:
    IOV_MAX = int(os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError):  # pragma: no cover - every Linux has it
    IOV_MAX = 1024
SINK_BYTES = 64 << 10
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
PAGE = mmap.PAGESIZE


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_NR_CACHESTAT = 451  # the same number on every architecture (Linux 6.5+)


_SYSCALL = libc_function("syscall", ctypes.c_long)  # variadic: arguments typed at the call
_cachestat_ok = _SYSCALL is not None and os.uname().sysname == "Linux"


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """How many pages of ``[offset, offset + length)`` of ``fd`` are in the page cache (``cachestat``).

    None where the kernel cannot say (before Linux 6.5) or will not (recent kernels report, as for
    ``mincore``, only on files the caller owns or may write): the caller then assumes cached. One system
    call, no mapping, nothing brought in.
    """
    global _cachestat_ok
    if not _cachestat_ok:
        return None
    if length <= 0:
        return 0
    rng, stat = _CacheStatRange(offset, length), _CacheStat()
    call = _SYSCALL
    assert call is not None
    ret = call(  # type: ignore[operator]
        ctypes.c_long(_NR_CACHESTAT),
        ctypes.c_uint(fd),
        ctypes.byref(rng),
        ctypes.byref(stat),
        ctypes.c_uint(0),
    )
    if ret != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _cachestat_ok = False  # not this kernel, or not for this caller: stop asking
        return None
    return int(stat.nr_cache)


def direct_middle(offset: int, length: int) -> tuple[int, int] | None:
    """The whole pages ``[a, b)`` inside file bytes ``[offset, offset + length)``, if worth O_DIRECT.

    None below :data:`~.schedule.DIRECT_MIN` bytes.
    """
    a, b = -(-offset // PAGE) * PAGE, (offset + length) // PAGE * PAGE
    return (a, b) if b - a >= DIRECT_MIN else None


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def anonymous(nbytes: int, *, huge: bool = False) -> mmap.mmap:
    """``nbytes`` (page-rounded, at least a page) of private anonymous memory, page-aligned.

    Private: ``mmap.mmap(-1, n)`` alone maps *shared* anonymous memory (tmpfs pages), which faulted in
    at a third of the speed here (a fresh 64 MiB destination filled from the page cache: 1.5 GB/s shared,
    2.0 private). ``huge``: advised for transparent huge pages, as numpy does for its own large arrays
    (a 2 MiB page per fault: 5.3 GB/s); for result arrays, not for reused buffers whose resident size
    should stay what they touch.
    """
    mapping = mmap.mmap(-1, max(PAGE, -(-nbytes // PAGE) * PAGE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages: small pages
            mapping.madvise(mmap.MADV_HUGEPAGE)
    return mapping


_MINCORE = libc_function("mincore", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])


@dataclass(frozen=True, slots=True)
class Dest:
    """``rows`` x ``width`` bytes at ``offset`` of ``buf`` (1-D, writable), rows ``stride`` bytes apart."""

    buf: memoryview
    offset: int
    stride: int
    rows: int
    width: int

    @property
    def contiguous(self) -> bool:
        """Whether the rows follow each other without gaps."""
        return self.rows <= 1 or self.stride == self.width

    def row(self, r: int) -> memoryview:
        """Row ``r`` as a writable view."""
        at = self.offset + r * self.stride
        return self.buf[at : at + self.width]

    def whole(self) -> memoryview:
        """All rows as one view (only for contiguous destinations)."""
        return self.buf[self.offset : self.offset + self.rows * self.width]

    def array(self) -> npt.NDArray[np.uint8]:
        """A ``uint8[rows, width]`` view."""
        return np.ndarray(
            (self.rows, self.width), np.uint8, buffer=self.buf, offset=self.offset, strides=(self.stride, 1)
        )


class MappedBands:
    """A batch's band extents mapped read-only, in groups (:func:`map_groups`), one mapping each.

    ``arrays[k]`` is band ``k``'s :func:`file_view` when every page its runs touch was in the
    page cache when mapped, else None (that band goes through ``preadv``). :meth:`release` after each
    band unmaps its group once all of the group's bands are done; :meth:`close` unmaps what is left.
    """

    def __init__(self, count: int) -> None:
        self.arrays: list[npt.NDArray[np.uint8] | None] = [None] * count
        self._group: dict[int, int] = {}  # band -> group
        self._left: dict[int, int] = {}  # group -> bands not yet released
        self._mappings: dict[int, mmap.mmap] = {}

    def keep(self, group: int, members: Sequence[int], mapping: mmap.mmap) -> None:
        """Own ``mapping``, the mapping of ``members``: unmapped once they are all released."""
        self._mappings[group] = mapping
        self._left[group] = len(members)
        self._group.update((k, group) for k in members)

    def release(self, k: int) -> None:
        """Band ``k`` is done: drop its view, and unmap its group if it was the group's last band."""
        self.arrays[k] = None
        group = self._group.pop(k, None)
        if group is not None:
            self._left[group] -= 1
            if not self._left[group]:
                self._unmap(group)

    def close(self) -> None:
        """Unmap everything (the pages stay in the page cache); the views must not be used afterwards."""
        self.arrays = [None] * len(self.arrays)
        for group in list(self._mappings):
            self._unmap(group)
        self._group.clear()

    @property
    def mapped_groups(self) -> int:
        """Groups still mapped."""
        return len(self._mappings)

    def _unmap(self, group: int) -> None:
        mapping = self._mappings.pop(group)
        try:
            mapping.close()
        except BufferError:  # a view still referenced (an exception's traceback): unmapped when it goes
            pass


def map_groups(bands: Sequence[Band], limit: int, among: Iterable[int] | None = None) -> list[list[int]]:
    """Which of ``bands`` (or of those indexed by ``among``) share a mapping (lists of band indices).

    Per file, in offset order, runs spanning at most ``limit`` bytes; a band whose own extent is larger
    is a group alone; empty bands are in no group. Each group is one mapping and one ``mincore`` over its
    whole extent (gaps included). A batch's groups are all mapped up front (address space only: neither
    ``mmap`` nor ``mincore`` brings pages in) and each is unmapped once its bands are released; a
    batch's bands are in (file, offset) order, so its groups are processed one after another and the
    file pages touched and still mapped per worker stay within the largest :func:`group_extent`.
    """
    live = [k for k in (range(len(bands)) if among is None else among) if bands[k].nbytes]
    order = sorted(live, key=lambda k: (bands[k].file, bands[k].offset))
    groups: list[list[int]] = []
    first = end = 0
    for k in order:
        band = bands[k]
        stop = band.offset + band.extent
        if groups and bands[groups[-1][0]].file == band.file and max(end, stop) - first <= limit:
            groups[-1].append(k)
            end = max(end, stop)
        else:
            groups.append([k])
            first, end = band.offset // PAGE * PAGE, stop
    return groups


def group_extent(bands: Sequence[Band], group: Sequence[int]) -> int:
    """Bytes a group's mapping covers (page-aligned start to its last band's end)."""
    first = min(bands[k].offset for k in group) // PAGE * PAGE
    return max(bands[k].offset + bands[k].extent for k in group) - first


def _rows_resident(resident: npt.NDArray[np.int64], skip: int, rows: int, width: int, stride: int) -> bool:
    """Whether every page that rows ``skip + r * stride + [0, width)`` touch is resident.

    ``resident[p]`` counts the resident pages before page ``p`` of the mapping (a prefix sum of the
    ``mincore`` vector, with a leading 0).
    """
    if rows <= 1 or stride == width:  # one contiguous run
        first, last = skip // PAGE, (skip + (rows - 1) * stride + width - 1) // PAGE
        return bool(resident[last + 1] - resident[first] == last - first + 1)
    firsts = skip + np.arange(rows, dtype=np.int64) * stride
    starts, ends = firsts // PAGE, (firsts + width - 1) // PAGE
    return bool(((resident[ends + 1] - resident[starts]) == ends - starts + 1).all())


def tile_columns(rows: npt.NDArray[np.uint8], tile_width: int) -> npt.NDArray[np.uint8]:
    """A ``rows x (n * tile_width)`` array (any row stride) as a view ``rows x n x tile_width``."""
    height, width = rows.shape
    s0, s1 = rows.strides
    return np.lib.stride_tricks.as_strided(
        rows,
        (height, width // tile_width, tile_width),
        (s0, tile_width * s1, s1),
        writeable=rows.flags.writeable,
    )


def file_view(
    buf: bytes | memoryview | npt.NDArray[np.uint8], offset: int, band: Band
) -> npt.NDArray[np.uint8]:
    """``band``'s bytes in ``buf`` from ``offset``, as its file lays them out.

    ``rows x width`` (rows ``stride`` apart) for a band without ``tile_width``; else ``runs x tiles x
    height x tile_width`` (tile rows ``stride`` apart, each its tiles one after the other).
    """
    if not band.tile_width:
        return np.ndarray(
            (band.rows, band.width), np.uint8, buffer=buf, offset=offset, strides=(band.stride, 1)
        )
    runs, tw = band.runs, band.tile_width
    height, tiles = band.rows // runs, band.width // tw
    return np.ndarray(
        (runs, tiles, height, tw),
        np.uint8,
        buffer=buf,
        offset=offset,
        strides=(band.stride, height * tw, tw, 1),
    )


BandCheck = Callable[[npt.NDArray[np.uint8], int], None]
"""``check(tiles, q0)``: hash and check tile rows ``q0, q0 + 1, ...`` of one tiled band, given as
``tiles`` (runs x tiles x height x tile_width, :func:`file_view`) in memory the load owns; raises on a
mismatch."""


def place(
    rows: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], band: Band, check: BandCheck | None = None
) -> None:
    """Copy ``src`` (:func:`file_view` of ``band``) into ``rows`` (the band's rows), de-tiling if tiled.

    A tiled band's tiles go to ``check`` first, where each is contiguous.
    """
    if not band.tile_width:
        rows[...] = src
        return
    if check is not None:
        check(src, 0)
    height = band.rows // band.runs
    out = tile_columns(rows, band.tile_width)  # rows x tiles x tile_width
    for q in range(band.runs):
        out[q * height : (q + 1) * height] = src[q].transpose(1, 0, 2)


def run_tiles(data: bytes | memoryview, band: Band) -> npt.NDArray[np.uint8]:
    """One run of tiled ``band`` at the start of ``data`` as ``1 x tiles x height x tile_width``."""
    height, tw = band.rows // band.runs, band.tile_width
    return np.frombuffer(data, np.uint8, band.run_bytes).reshape(1, band.width // tw, height, tw)


def place_run(
    rows: npt.NDArray[np.uint8], data: bytes | memoryview, band: Band, q: int, check: BandCheck | None = None
) -> None:
    """Copy run ``q`` of ``band`` (its ``run_bytes`` at the start of ``data``) into ``rows``.

    A run is one row of a row-major band, or one tile row (its tiles one after the other) of a tiled one,
    whose tiles go to ``check`` first.
    """
    if not band.tile_width:
        rows[q] = np.frombuffer(data, np.uint8, band.run_bytes)
        return
    tiles = run_tiles(data, band)
    if check is not None:
        check(tiles, q)
    height = band.rows // band.runs
    tile_columns(rows[q * height : (q + 1) * height], band.tile_width)[...] = tiles[0].transpose(1, 0, 2)


def lands_whole(band: Band, dest: Dest) -> bool:
    """Whether ``band``'s file bytes are ``dest``'s bytes as they lie: both contiguous, not de-tiled.

    A tiled band only as a single tile column, whose tile rows lie as matrix rows.
    """
    return dest.contiguous and band.contiguous and (not band.tile_width or band.width == band.tile_width)


def _bounces(band: Band, dest: Dest) -> bool:
    """Whether a local read of ``band`` goes through the bounce buffer (tiled, unless it lands whole)."""
    return bool(band.tile_width) and not lands_whole(band, dest)


def band_pieces(band: Band, dest: Dest, at: int) -> list[tuple[int, memoryview]]:
    """(file offset - band offset + ``at``, destination view) for each piece of ``band`` in ``dest``.

    One piece when it lands whole, else a piece per row. Other tiled bands go through the bounce buffer.
    """
    if lands_whole(band, dest):
        return [(at, dest.whole())]
    if band.tile_width:
        raise RangeReadError(
            f"{band.file}: tensor {band.tensor!r}: tiled bands are read through a bounce buffer"
        )
    return [(at + r * band.stride, dest.row(r)) for r in range(band.rows)]


TileCheck = Callable[[int, npt.NDArray[np.uint8], int], None]
"""``check(k, tiles, q0)``: :data:`BandCheck` for band ``k`` of a fetch."""


def _band_check(check: TileCheck | None, k: int) -> BandCheck | None:
    return None if check is None else partial(check, k)


class BlobSource(Protocol):
    """Reads checkpoint files (stored as blobs) into band destinations."""

    kind: str
    holds_responses: bool
    """Whether a fetch holds the fetched bytes besides the destinations (S3 responses)."""
    direct_bytes: int
    """Bytes read so far with O_DIRECT (not through the page cache)."""
    retries: int
    """Requests retried so far (S3: a reset, truncated or 5xx answer re-requested)."""

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        """Fill ``dests[k]`` with the bytes of ``bands[k]`` for every band ``plan`` reads.

        A tiled band's bytes that pass through the load's own memory as the file lays them out (a bounce
        buffer, an S3 response), where each tile is contiguous, go to ``check`` there, before they are
        de-tiled into the destination (no gather needed to hash them). Returns whether the fetch waited
        on the storage (some of it not in memory: the page cache) rather than only copied.
        """

    def map_cached(
        self, bands: Sequence[Band], limit: int, among: Iterable[int] | None = None
    ) -> MappedBands:
        """The bands (``among``: only those) whose file bytes are all in memory, mapped read-only.

        In groups spanning at most ``limit`` bytes; release each band after use, close at the end.
        """

    def prefetch(self, plan: FetchPlan, bands: Sequence[Band]) -> None:
        """Ask the storage to start on ``plan``'s spans (of ``bands``) now (:meth:`fetch` reads them)."""

    def close(self) -> None:
        """Release files and connections."""


def _where(file: str, key: str, offset: int, length: int) -> str:
    return f"{file} (blob {key}): bytes [{offset}, {offset + length})"


class LocalBlobSource:
    """Blobs of a local store, read with ``os.preadv`` into caller-owned buffers."""

    kind = "local"
    holds_responses = False
    retries = 0

    def __init__(self, store: Store, blobs: Mapping[str, str], *, direct: bool = False) -> None:
        self._keys = {file: blob_key(digest) for file, digest in blobs.items()}
        self._store = store
        self._direct = direct
        self.direct_bytes = 0
        self._fds: dict[str, int] = {}
        self._direct_fds: dict[str, int | None] = {}
        self._direct_off: set[str] = set()  # files whose O_DIRECT reads were refused
        self._lock = threading.Lock()
        self._sink = memoryview(anonymous(SINK_BYTES))
        self._local = threading.local()  # each worker thread's bounce buffer
        self._bounce_maps: list[mmap.mmap] = []

    def _fd(self, file: str) -> int:
        with self._lock:
            fd = self._fds.get(file)
            if fd is not None:
                return fd
            key = self._keys[file]
            try:  # no link followed, a regular file: a pipe, a device or a folder is refused
                fd = self._store.open_local(key)
            except NotFoundError as exc:
                raise BlobNotFoundError(f"{file}: blob {key} is not in the store {self._store.url}") from exc
            except StoreObjectError as exc:
                raise StoreObjectError(f"{file}: {exc}") from exc
            except StoreError as exc:
                raise RangeReadError(f"{file} (blob {key}): cannot open: {exc}") from exc
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            self._fds[file] = fd
            return fd

    def _direct_fd(self, file: str) -> int | None:
        """The blob opened with ``O_DIRECT`` (None where its file system refuses that).

        Opened like the buffered descriptor (no link, a regular file) and required to be the same file.
        """
        first = os.fstat(self._fd(file))  # a missing or unsafe blob is reported there
        with self._lock:
            if file in self._direct_off:
                return None
            if file not in self._direct_fds:
                key = self._keys[file]
                try:
                    dfd: int | None = self._store.open_local(key, flags=os.O_DIRECT)
                except StoreObjectError as exc:
                    raise StoreObjectError(f"{file}: {exc}") from exc
                except StoreError:  # no O_DIRECT here (tmpfs before Linux 6.6, some FUSE file systems)
                    dfd = None
                if dfd is not None and not os.path.samestat(os.fstat(dfd), first):
                    os.close(dfd)
                    raise StoreObjectError(f"{file}: blob {key} was replaced while it was being read")
                self._direct_fds[file] = dfd
            return self._direct_fds[file]

    def _uncached(self, span: Span) -> bool:
        """Whether ``span`` is :data:`~.schedule.DIRECT_MIN` or longer and at most an eighth of it cached.

        Asked with ``cachestat`` (a kernel that cannot say counts as cached).
        """
        if span.length < DIRECT_MIN:
            return False
        cached = cached_pages(self._fd(span.file), span.offset, span.length)
        return cached is not None and cached * 8 <= -(-span.length // PAGE)

    def _goes_direct(self, span: Span) -> bool:
        """Whether ``span`` is read with ``O_DIRECT``: direct reads on, and (almost) not cached."""
        return self._direct and self._uncached(span)

    def map_cached(
        self, bands: Sequence[Band], limit: int, among: Iterable[int] | None = None
    ) -> MappedBands:
        """Map the extents of a batch's ``bands`` (``among``: only those); keep the cached ones' views.

        Bands are mapped in groups (:func:`map_groups`: nearby bands of one file, spanning at most
        ``limit`` bytes; page-aligned; ``MADV_RANDOM``: a page evicted between the check and the copy
        faults in alone, no readahead), each unmapped once its bands are released, so the file pages
        mapped into the process stay within a group's extent per worker. One ``mincore`` per group
        decides, per band, over the pages its rows touch (not the gaps between them). A band past the
        blob's end (a truncated blob: the ``preadv`` path reports it), or in a file that cannot be
        mapped, gets no view. Since Linux 5.0 ``mincore`` reports the page cache only for files the
        caller owns or may write; for others it sees nothing cached and every band takes the ``preadv``
        path. A disk error while a page faults in during the copy raises ``SIGBUS`` (the kernel's, not
        ours): blobs are immutable and the check just saw the page cached, so this needs an eviction
        and a failing disk at once.
        """
        out = MappedBands(len(bands))
        if _MINCORE is None:
            return out
        try:
            sizes: dict[str, int] = {}
            for g, group in enumerate(map_groups(bands, limit, among)):
                file = bands[group[0]].file
                fd = self._fd(file)
                if file not in sizes:
                    sizes[file] = os.fstat(fd).st_size
                if all(bands[k].offset + bands[k].extent <= sizes[file] for k in group):
                    self._map_group(fd, bands, g, group, out)
        except BaseException:
            out.close()
            raise
        return out

    @staticmethod
    def _map_group(fd: int, bands: Sequence[Band], g: int, group: list[int], out: MappedBands) -> None:
        first = bands[group[0]].offset // PAGE * PAGE
        length = group_extent(bands, group)
        try:
            mapping = mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=first)
        except (OSError, ValueError):  # not mappable here (some FUSE or network file systems)
            return
        out.keep(g, group, mapping)
        whole = np.frombuffer(mapping, dtype=np.uint8)
        vec = np.empty(-(-length // PAGE), dtype=np.uint8)
        try:
            mapping.madvise(mmap.MADV_RANDOM)
            if _MINCORE(int(whole.ctypes.data), length, vec.ctypes.data) != 0:  # type: ignore[operator]
                return
        except (OSError, ValueError):
            return
        resident = np.concatenate(([0], np.cumsum(vec & 1, dtype=np.int64)))
        for k in group:
            band = bands[k]
            skip = band.offset - first
            if _rows_resident(resident, skip, band.runs, band.run_bytes, band.stride):
                out.arrays[k] = file_view(whole, skip, band)

    def prefetch(self, plan: FetchPlan, bands: Sequence[Band]) -> None:
        """``POSIX_FADV_WILLNEED`` on each span: the device reads exactly those bytes ahead, in parallel.

        This is the readahead that ``POSIX_FADV_RANDOM`` turned off, limited to bytes the load reads. A
        span that will be read with ``O_DIRECT`` (:meth:`_goes_direct`) is not brought into the page
        cache: only its bands too small for that, and the partial pages at the ends of the others, are.
        """
        for span in plan.spans:
            fd = self._fd(span.file)
            if not self._goes_direct(span):
                os.posix_fadvise(fd, span.offset, span.length, os.POSIX_FADV_WILLNEED)
                continue
            if any(bands[k].tile_width and bands[k].width != bands[k].tile_width for k, _ in span.members):
                continue  # tiles to de-tile: the span is read whole, page by page, with O_DIRECT
            for k, _ in span.members:
                band = bands[k]
                middle = direct_middle(band.offset, band.extent) if band.contiguous else None
                if middle is None:
                    os.posix_fadvise(fd, band.offset, band.extent, os.POSIX_FADV_WILLNEED)
                    continue
                for lo, hi in ((band.offset, middle[0]), (middle[1], band.offset + band.extent)):
                    if hi > lo:
                        os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)

    def _gap(self, views: list[memoryview], n: int) -> None:
        while n > 0:
            step = min(n, SINK_BYTES)
            views.append(self._sink[:step])
            n -= step

    def _read(self, fd: int, views: list[memoryview], offset: int, file: str, length: int) -> None:
        """``preadv`` until every view is full (short reads continue; end of file is an error)."""
        start, k = offset, 0
        while k < len(views):
            try:
                n = os.preadv(fd, views[k : k + IOV_MAX], offset)
            except OSError as exc:
                raise RangeReadError(
                    f"{_where(file, self._keys[file], start, length)}: read failed: {exc}"
                ) from exc
            if n == 0:
                where = _where(file, self._keys[file], start, length)
                raise RangeReadError(f"{where}: end of blob at {offset} (blob truncated; run fsck)")
            offset += n
            while n and k < len(views):
                size = views[k].nbytes
                if n >= size:
                    n, k = n - size, k + 1
                else:
                    views[k], n = views[k][n:], 0

    def _read_direct(self, fd: int, view: memoryview, offset: int, file: str, need: int) -> bool:
        """``O_DIRECT`` read into ``view`` from ``offset`` (both page-aligned), at least ``need`` bytes.

        The rest of ``view`` may lie past the blob's end. False when the file system refuses the read
        (``EINVAL``: an alignment it does not take): the caller reads it through the page cache, and
        the file is not read with ``O_DIRECT`` again.
        """
        got = 0
        while got < need:
            try:
                n = os.preadv(fd, [view[got:]], offset + got)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    with self._lock:
                        self._direct_off.add(file)
                    return False
                where = _where(file, self._keys[file], offset, view.nbytes)
                raise RangeReadError(f"{where}: read failed: {exc}") from exc
            if n == 0:
                where = _where(file, self._keys[file], offset, need)
                raise RangeReadError(f"{where}: end of blob at {offset + got} (blob truncated; run fsck)")
            got += n
        with self._lock:
            self.direct_bytes += got
        return True

    def _read_bounced(self, fd: int, direct: int | None, file: str, offset: int, length: int) -> memoryview:
        """File bytes ``[offset, offset + length)`` in the thread's bounce buffer (a view starting there).

        With ``direct`` (the ``O_DIRECT`` descriptor), the pages holding them are read whole, unless the
        file system refuses that (:meth:`_read_direct`); else one ``preadv``.
        """
        if direct is not None and file not in self._direct_off:
            lo, hi = offset // PAGE * PAGE, -(-(offset + length) // PAGE) * PAGE
            bounce = self._bounce(hi - lo)
            if self._read_direct(direct, bounce[: hi - lo], lo, file, offset + length - lo):
                return bounce[offset - lo : offset - lo + length]
        bounce = self._bounce(length)
        self._read(fd, [bounce[:length]], offset, file, length)
        return bounce[:length]

    def _bounce(self, nbytes: int) -> memoryview:
        """The calling thread's bounce buffer, at least ``nbytes`` (page-aligned, reused).

        A buffer too small is replaced (unmapped first), so a thread holds one buffer at a time.
        """
        buf: memoryview | None = getattr(self._local, "buf", None)
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        old: mmap.mmap | None = getattr(self._local, "mapping", None)
        if buf is not None and old is not None:
            with contextlib.suppress(BufferError):
                buf.release()
            with self._lock:
                self._bounce_maps.remove(old)
            with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
                old.close()
        mapping = anonymous(nbytes)
        with self._lock:
            self._bounce_maps.append(mapping)
        self._local.mapping = mapping
        buf = self._local.buf = memoryview(mapping)
        return buf

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        """Spans: one scatter read each; row bands: one read per row (per tile row if tiled).

        Waited on the storage (the return value): a span (almost) not cached (:meth:`_uncached`), or row
        bands with a row not cached.

        A span holding a tiled band (other than one tile landing whole in a contiguous destination) is
        read as it lies in the file into the thread's bounce buffer, its tiled bands checked there
        (``check``) and placed (de-tiled) from there: scattering it straight into the destinations would
        take an iovec per tile row piece, and such reads of pages not yet cached ran at a third of the
        disk's speed.
        """
        waited = False
        for span in plan.spans:
            fd = self._fd(span.file)
            uncached = self._uncached(span)
            waited |= uncached
            direct = self._direct_fd(span.file) if self._direct and uncached else None
            if any(_bounces(bands[k], dests[k]) for k, _ in span.members):
                data = self._read_bounced(fd, direct, span.file, span.offset, span.length)
                for k, at in span.members:
                    place(dests[k].array(), file_view(data, at, bands[k]), bands[k], _band_check(check, k))
                continue
            pieces: list[tuple[int, memoryview]] = []  # (offset in span, destination); bands may interleave
            for k, at in span.members:  # rows scattered into a strided destination
                pieces += band_pieces(bands[k], dests[k], at)
            pieces.sort(key=lambda p: p[0])
            if direct is None:
                self._scatter(fd, span, pieces)
                continue
            rest: list[tuple[int, memoryview]] = []
            for at, view in pieces:
                self._direct_piece(direct, span, at, view, rest)
            groups: list[list[tuple[int, memoryview]]] = []
            for at, view in rest:  # what is left (ends of pages, small pieces), one read per nearby run
                if not groups or at - (groups[-1][-1][0] + groups[-1][-1][1].nbytes) > PAGE:
                    groups.append([])
                groups[-1].append((at, view))
            for group in groups:
                first, last = group[0][0], group[-1][0] + group[-1][1].nbytes
                part = Span(span.file, span.offset + first, last - first, ())
                self._scatter(fd, part, [(at - first, view) for at, view in group])
        for k in plan.row_bands:
            waited |= self._read_rows(bands[k], dests[k], _band_check(check, k))
        return waited

    def _scatter(self, fd: int, span: Span, pieces: Sequence[tuple[int, memoryview]]) -> None:
        """One scatter read of ``span`` into ``pieces`` ((offset in span, view), in order; gaps sunk)."""
        views: list[memoryview] = []
        pos = 0
        for at, view in pieces:
            self._gap(views, at - pos)
            views.append(view)
            pos = at + view.nbytes
        self._read(fd, views, span.offset, span.file, span.length)

    def _direct_piece(
        self, fd: int, span: Span, at: int, view: memoryview, rest: list[tuple[int, memoryview]]
    ) -> None:
        """Read the whole pages of piece ``view`` (at ``at`` in ``span``) with ``O_DIRECT``; the rest later.

        Only where its memory lines up with the file (the same offset within a page); what is not read
        here is appended to ``rest``.
        """
        offset = span.offset + at
        middle = direct_middle(offset, view.nbytes)
        if middle is None or (_address(view) - offset) % PAGE:
            rest.append((at, view))
            return
        a, b = middle[0] - offset, middle[1] - offset
        if not self._read_direct(fd, view[a:b], middle[0], span.file, b - a):
            rest.append((at, view))
            return
        if a:
            rest.append((at, view[:a]))
        if b < view.nbytes:
            rest.append((at + b, view[b:]))

    def _read_rows(self, band: Band, dest: Dest, check: BandCheck | None) -> bool:
        """One ``preadv`` per row (the hot loop of column slices of row-major tensors).

        Rows are first tried with ``RWF_NOWAIT`` (page cache only). At the first row that is not cached,
        every remaining row of the band is announced with ``POSIX_FADV_WILLNEED`` — exactly those byte
        ranges, so the device works on them in parallel instead of one small read at a time — and the
        rest is read normally. Returns whether a row was not cached (tile rows: the first, as it judges
        all of them).
        """
        fd, buf, width = self._fd(band.file), dest.buf, band.width
        if band.tile_width:  # tile rows: each read whole (bounced), then de-tiled
            run, rows = band.run_bytes, dest.array()
            cold = self._uncached(Span(band.file, band.offset, run, ()))  # judged by the first run
            direct = self._direct_fd(band.file) if self._direct and cold else None
            if direct is None:  # announced at once: the device works on them together
                for q in range(band.runs):
                    os.posix_fadvise(fd, band.offset + q * band.stride, run, os.POSIX_FADV_WILLNEED)
            for q in range(band.runs):
                data = self._read_bounced(fd, direct, band.file, band.offset + q * band.stride, run)
                place_run(rows, data, band, q, check)
            return cold
        src, dst = band.offset, dest.offset
        flags, waited = _NOWAIT, False
        for r in range(band.rows):
            view = buf[dst : dst + width]
            try:
                try:
                    n = os.preadv(fd, [view], src, flags)
                except BlockingIOError:
                    for k in range(r, band.rows):
                        os.posix_fadvise(fd, src + (k - r) * band.stride, width, os.POSIX_FADV_WILLNEED)
                    flags, waited = 0, True
                    n = os.preadv(fd, [view], src)
            except OSError as exc:
                where = _where(band.file, self._keys[band.file], src, width)
                raise RangeReadError(f"{where}: read failed: {exc}") from exc
            if n != width:
                self._read(fd, [view[n:]], src + n, band.file, width - n)
            src += band.stride
            dst += dest.stride
        return waited

    def close(self) -> None:
        """Close the blob files and drop the bounce buffers."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            for dfd in self._direct_fds.values():
                if dfd is not None:
                    os.close(dfd)
            self._direct_fds.clear()
            for mapping in self._bounce_maps:
                with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
                    mapping.close()
            self._bounce_maps.clear()
        self._local = threading.local()


class S3BlobSource:
    """Blobs of an S3 store, read with fsspec ``cat_ranges`` (bounded concurrency)."""

    kind = "s3"
    holds_responses = True
    direct_bytes = 0

    def __init__(
        self,
        store: Store,
        blobs: Mapping[str, str],
        *,
        concurrency: int = 16,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._keys = {file: blob_key(digest) for file, digest in blobs.items()}
        self._store = store
        self._concurrency = max(1, concurrency)
        self._retry = retry
        self._lock = threading.Lock()
        self.retries = 0

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        """All of the batch's ranges concurrently, then copy each into its destination.

        Each range is read with bounded, retried GETs (:meth:`~shardport.registry.store.Store.read_ranges`:
        a reset, a truncated body or a 5xx re-requests that range alone; 4xx answers are final; every byte
        is still verified above). Tiled bands are checked in the responses first. Always waits on the
        network (returns True).
        """
        ranges = [(s.file, s.offset, s.length) for s in plan.spans]
        for k in plan.row_bands:
            b = bands[k]
            ranges += [(b.file, b.offset + r * b.stride, b.run_bytes) for r in range(b.runs)]
        if not ranges:
            return False
        try:
            results, retries = self._store.read_ranges(
                [(self._keys[f], o, o + n) for f, o, n in ranges],
                concurrency=self._concurrency,
                retry=self._retry,
            )
        except Exception as exc:  # the backend's own errors, wrapped once
            raise RangeReadError(f"{len(ranges)} ranges from {self._store.url}: {exc}") from exc
        with self._lock:
            self.retries += retries
        got: list[bytes] = []
        for (file, offset, length), data in zip(ranges, results, strict=True):
            where = _where(file, self._keys[file], offset, length)
            if isinstance(data, FileNotFoundError):
                raise BlobNotFoundError(f"{where}: blob not in the store {self._store.url}") from data
            if isinstance(data, BaseException):
                raise RangeReadError(f"{where}: {type(data).__name__}: {data}") from data
            if len(data) != length:
                raise RangeReadError(f"{where}: got {len(data)} bytes (blob truncated; run fsck)")
            got.append(data)
        for span, data in zip(plan.spans, got, strict=False):
            for k, at in span.members:
                place(dests[k].array(), file_view(data, at, bands[k]), bands[k], _band_check(check, k))
        runs = iter(got[len(plan.spans) :])
        for k in plan.row_bands:
            rows, band_check = dests[k].array(), _band_check(check, k)
            for q in range(bands[k].runs):
                place_run(rows, next(runs), bands[k], q, band_check)
        return True

    def map_cached(
        self, bands: Sequence[Band], limit: int, among: Iterable[int] | None = None
    ) -> MappedBands:
        """Nothing: every byte comes over the network."""
        return MappedBands(len(bands))

    def prefetch(self, plan: FetchPlan, bands: Sequence[Band]) -> None:
        """Nothing: the batch's requests go out together when it is fetched."""

    def close(self) -> None:
        """Nothing to release (the filesystem object is the store's)."""


def open_source(
    store: Store,
    blobs: Mapping[str, str],
    *,
    concurrency: int = 16,
    direct: bool = False,
    retry: RetryPolicy | None = None,
) -> BlobSource:
    """The source for ``store``'s backend (``direct``: cold local spans read with ``O_DIRECT``).

    ``retry``: the S3 reads' retry policy (None: the store's).
    """
    if store.is_local:
        return LocalBlobSource(store, blobs, direct=direct)
    return S3BlobSource(store, blobs, concurrency=concurrency, retry=retry)
