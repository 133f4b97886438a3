"""Local blob source: ``preadv`` scatter, ``O_DIRECT`` for cold spans, cached bands copied from mappings."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, StoreObjectError
from shardport.registry.store.keys import blob_key
from shardport.registry.store.protocol import Store

from ..bands import DIRECT_MIN, Band
from ..errors import BlobNotFoundError, RangeReadError
from ..ranges import FetchPlan, Span
from ._linux import (
    _MINCORE,
    _NOWAIT,
    IOV_MAX,
    PAGE,
    SINK_BYTES,
    _address,
    anonymous,
    cached_pages,
    direct_middle,
)
from .placing import (
    BandCheck,
    Dest,
    MappedBands,
    TileCheck,
    _band_check,
    _bounces,
    _rows_resident,
    band_pieces,
    file_view,
    group_extent,
    map_groups,
    place,
    place_run,
)
from .protocol import _where


class LocalBlobSource:
    """Blobs of a store with local files (``Store.open_local``), read with ``os.preadv`` into buffers."""

    kind = "local"
    holds_responses = False
    retries = 0

    def __init__(
        self,
        store: Store,
        blobs: Mapping[str, str],
        *,
        direct: bool = False,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        """``sizes``: each file's size as the manifest states it; a blob of another size is refused."""
        self._keys = {file: blob_key(digest) for file, digest in blobs.items()}
        self._sizes = dict(sizes or {})
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
            expected, actual = self._sizes.get(file), os.fstat(fd).st_size
            if expected is not None and actual != expected:  # its tiles may hash right; the blob is not it
                os.close(fd)
                raise DigestMismatchError(
                    f"{file}: blob {key} holds {actual} bytes, but the manifest says {expected} "
                    "(the blob was truncated or extended; run fsck)"
                )
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
        """Whether ``span`` is :data:`~.bands.DIRECT_MIN` or longer and at most an eighth of it cached.

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
            if any(bands[k].detiles for k, _ in span.members):
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
            if any(_bounces(bands[k]) for k, _ in span.members):
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
