"""Bands into destinations: where a band's bytes go (:class:`Dest`), mapped bands, de-tiling (pure)."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from ..bands import Band
from ..errors import RangeReadError
from ._linux import PAGE


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


def _bounces(band: Band) -> bool:
    """Whether a local read of ``band`` goes through the bounce buffer (tiled, unless it lands whole)."""
    return bool(band.tile_width) and not band.whole


def band_pieces(band: Band, dest: Dest, at: int) -> list[tuple[int, memoryview]]:
    """(file offset - band offset + ``at``, destination view) for each piece of ``band`` in ``dest``.

    One piece when it lands whole (:attr:`~.bands.Band.whole`, decided in the plan, ``dest`` built from
    it), else a piece per row. Other tiled bands go through the bounce buffer.
    """
    if band.whole:
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
