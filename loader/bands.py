"""Bands (pure): a block of tiles read and verified together, with every decision about it made at plan time.

A :class:`Band` is tiles ``(i..i1-1, j0..j1-1)`` of one tensor. Besides where its bytes lie in the file
(its *runs*, see :mod:`.schedule`), it carries where they land and how, decided when the band is planned
(:mod:`.banding`), so that the runner and the sources only execute:

* *direct* or *staged*: ``direct`` is the slice whose result array receives the band in place (at
  :attr:`Band.at`, rows :attr:`Band.pitch` bytes apart), or -1: the band is read into its batch's
  staging slot (:attr:`~.schedule.Batch.slots`) and its :class:`Part` s are copied out once verified;
* :attr:`Band.whole`: its file bytes are its destination's bytes as they lie (one ``preadv``, or one
  ``O_DIRECT`` read of its whole pages, straight in); :attr:`Band.detiles`: its tiles are de-tiled;
* :attr:`Band.maps`: whether it may be copied out of a mapping of the page cache (a direct band that
  lands whole is not: ``preadv`` copies it once either way);
* :attr:`Band.scatter`: a staged band whose tiles each lie inside one part spanning all its rows goes
  straight from its source into the result arrays (no staging copy);
* its tiles' byte columns (:attr:`Band.tile_byte_columns`) and rows (:meth:`Band.tile_rows`) in the band;
* :func:`direct_shifts`: where in a page a slice's result array starts, so that a large direct band's
  whole file pages line up with the array's pages (``O_DIRECT`` needs both aligned).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from operator import itemgetter
from typing import NamedTuple

PAGE = mmap.PAGESIZE
DIRECT_MIN = 256 << 10
"""Smallest read a local cold read takes with O_DIRECT (a span; a band's whole pages): smaller ones go
through the page cache, announced ahead."""


class Part(NamedTuple):
    """What slice ``slice`` takes from a staged band: band rows/cols → its array at (out_row, out_col)."""

    slice: int
    row0: int
    row1: int
    col0: int
    col1: int
    out_row: int
    out_col: int


_by_column = itemgetter(3)  # Part.col0


class Band(NamedTuple):
    """Tiles ``(i..i1-1, j0..j1-1)`` of ``tensor``: matrix rows ``[row0, row1)`` x bytes ``[col0, col1)``.

    Most bands hold one tile row (``i1 = i + 1``); adjacent tile rows that go the same way (same tile
    columns, same destination) are one band, verified tile row by tile row.

    ``direct`` is the slice whose array receives the band in place at ``(out_row, out_col)``, rows
    ``pitch`` bytes apart (that array's width), or -1 for a staged band (then ``parts`` say who takes
    what after verification, and ``pitch`` is the band's own width: its staging slot holds it whole).

    The band's matrix is ``rows`` x ``width`` bytes. File geometry (see :mod:`.schedule`): with
    ``tile_width`` 0 (a row-major tensor), its rows are the runs, the first at file offset ``origin``,
    ``stride`` bytes apart (``start + row0 * row_bytes + col0`` and ``row_bytes``, see :meth:`rect`);
    with ``tile_width`` > 0 (a tiled tensor), its tile rows are the runs, each its tiles of
    ``tile_width`` bytes one after the other. ``start`` and ``row_bytes`` are the tensor's matrix,
    ``row_block`` x ``col_block`` its tiles. An immutable named tuple: a load plans hundreds to
    thousands of bands, and a frozen dataclass cost six times as much to build.
    """

    tensor: str
    file: str
    start: int
    row_bytes: int
    i: int
    i1: int
    j0: int
    j1: int
    row0: int
    row1: int
    col0: int
    col1: int
    direct: int
    out_row: int
    out_col: int
    parts: tuple[Part, ...]
    origin: int
    stride: int
    rows: int
    """Rows of the band."""
    width: int
    """Bytes per band row."""
    nbytes: int
    """Bytes of the band (of its tiles)."""
    pitch: int
    """Bytes between the band's rows in its destination (a direct band's slice width, else ``width``)."""
    row_block: int
    """The tensor's tile height (matrix rows)."""
    col_block: int
    """The tensor's tile width (bytes)."""
    scatter: bool = False
    """A staged band whose parts take its tiles whole, all rows each: copied straight into them."""
    tile_width: int = 0
    """0: the file holds the band's rows; > 0: its tile rows, as tiles this many bytes wide."""

    @classmethod
    def rect(
        cls,
        tensor: str,
        file: str,
        start: int,
        row_bytes: int,
        i: int,
        j0: int,
        j1: int,
        row0: int,
        row1: int,
        col0: int,
        col1: int,
        direct: int,
        out_row: int,
        out_col: int,
        parts: tuple[Part, ...],
        *,
        pitch: int | None = None,
        col_block: int | None = None,
    ) -> Band:
        """Tile row ``i`` of a row-major tensor's rectangle as a band (origin, stride and sizes derived).

        Its tiles are one tile row high and ``col_block`` wide (None: the band's width over its tile
        columns); ``pitch`` None: the band's width (a staged band, or a direct one into an array as wide).
        """
        rows, width = row1 - row0, col1 - col0
        origin = start + row0 * row_bytes + col0
        return cls(
            tensor, file, start, row_bytes, i, i + 1, j0, j1, row0, row1, col0, col1, direct, out_row,
            out_col, parts, origin, row_bytes, rows, width, rows * width, width if pitch is None else pitch,
            rows, -(-width // max(1, j1 - j0)) if col_block is None else col_block,
        )  # fmt: skip

    @property
    def offset(self) -> int:
        """File offset of the band's first byte (``origin``)."""
        return self.origin

    @property
    def runs(self) -> int:
        """Runs of bytes in the file: the rows, or the tile rows of a band with ``tile_width``."""
        return self.i1 - self.i if self.tile_width else self.rows

    @property
    def run_bytes(self) -> int:
        """Bytes per run."""
        return self.nbytes // (self.i1 - self.i) if self.tile_width else self.width

    @property
    def contiguous(self) -> bool:
        """Whether the band's runs follow each other in the file (one run of ``nbytes`` bytes)."""
        return self.runs <= 1 or self.stride == self.run_bytes

    @property
    def extent(self) -> int:
        """Bytes from the first to one past the last byte of the band in its file."""
        runs = self.runs
        return (runs - 1) * self.stride + self.run_bytes if runs else 0

    @property
    def at(self) -> int:
        """A direct band's first byte in its slice's result array (a staged band's is its slot)."""
        return self.out_row * self.pitch + self.out_col

    @property
    def detiles(self) -> bool:
        """Whether its tiles are de-tiled on the way in (a tiled band of several tile columns)."""
        return bool(self.tile_width) and self.width != self.tile_width

    @property
    def whole(self) -> bool:
        """Whether the band's file bytes are its destination's bytes as they lie: both contiguous.

        A tiled band only as a single tile column, whose tile rows lie as matrix rows.
        """
        return (self.rows <= 1 or self.pitch == self.width) and self.contiguous and not self.detiles

    @property
    def maps(self) -> bool:
        """Whether the band may be copied out of a mapping when its pages are cached.

        Not a direct band that lands whole in its slice's array (contiguous in the file and there, not
        de-tiled): ``preadv`` copies it once either way, and when it is not cached, mapping its extent
        and checking its pages only delays the read (in a cold row-split rank, ~9% of each worker's time).
        """
        return self.direct < 0 or not self.whole

    @property
    def tile_byte_columns(self) -> list[tuple[int, int]]:
        """Each tile's byte columns ``[a, b)`` within the band."""
        cb, end, col0 = self.col_block, self.row_bytes, self.col0
        return [(j * cb - col0, min((j + 1) * cb, end) - col0) for j in range(self.j0, self.j1)]

    def tile_rows(self) -> Iterable[tuple[int, int, int]]:
        """Each tile row ``i`` with its band rows ``[r0, r1)``."""
        rb, row0, row1 = self.row_block, self.row0, self.row1
        return ((i, i * rb - row0, min((i + 1) * rb, row1) - row0) for i in range(self.i, self.i1))


def scatters(parts: tuple[Part, ...], rows: int, width: int, col_block: int) -> bool:
    """Whether a staged band's ``parts`` take each of its tiles whole, all ``rows`` each.

    Only then can the band (``width`` bytes, tiles ``col_block`` wide from its first byte) go straight
    into its parts (a node's whole tile row split by columns among its ranks): the parts, in column
    order, must tile ``[0, width)`` end to end, each starting and ending on a tile boundary. Parts that
    overlap (a tile several slices take whole) are copied once, then out.
    """
    reach = 0
    for p in sorted(parts, key=_by_column):
        if p.row0 or p.row1 != rows or p.col0 != reach or (p.col1 % col_block and p.col1 != width):
            return False
        reach = p.col1
    return reach == width > 0


def direct_shifts(bands: Iterable[Band]) -> dict[int, int]:
    """Per slice with a large direct band landing whole in it: where in a page its result array starts.

    So that the band's whole file pages line up with pages of the array (O_DIRECT reads them there);
    the first such band (in read order) decides.
    """
    shifts: dict[int, int] = {}
    for band in bands:
        if band.direct < 0 or band.direct in shifts or band.nbytes < DIRECT_MIN:
            continue
        if band.whole:
            shifts[band.direct] = (band.offset - band.at) % PAGE
    return shifts
