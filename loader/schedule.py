"""Read schedule (pure): requested slices → covering tiles → bands → batches with their fetch plans.

A :class:`PlaneSlice` asks for rows ``[row0, row1)`` x byte columns ``[col0, col1)`` of a tensor's
physical byte matrix (the tile index's ``rows`` x ``row_bytes``). Every tile it touches is read whole,
so that it can be verified; a tile several slices touch is read once. :mod:`.banding` cuts the touched
tiles into bands (:class:`~.bands.Band`), direct or staged, each carrying where and how it lands.

In its file a band is ``runs`` runs of ``run_bytes`` bytes, the first at ``origin``, ``stride`` bytes
apart. For a row-major tensor (``layout="row_major"``) the runs are the rows of the band's rectangle of
the byte matrix (``origin = start + row0·row_bytes + col0``, ``stride = row_bytes``). For a tensor in
the ``shardport-tiled`` layout (:mod:`shardport.registry.tiles.layout`) tiles are contiguous and the
tiles of a tile row follow each other, so each of the band's tile rows is one run: its tiles
``j0..j1-1`` one after the other (``tile_width`` bytes wide each, all of one width), ``stride`` = a whole
tile row's bytes apart; the loader de-tiles them into the band's rows. The fetch planner merges runs
that touch, so a rank's whole tile rows are one read.

Bands are ordered by file offset and packed into :class:`Batch` es of at most ``batch_bytes`` band
bytes (a band whose rows the fetch plan reads as one range because requests have a price counts its
extent, :func:`~.ranges.priced`), each with its :class:`~.ranges.FetchPlan`. A staged band gets a
*slot* in its batch's page-aligned staging buffer (a contiguous band of at least
:data:`~.bands.DIRECT_MIN` at its offset within its first file page, so O_DIRECT can read its whole
pages there: a page more per such band).
The schedule also carries each slice's result-array shift (:func:`~.bands.direct_shifts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from shardport.placement.planner import paused_gc
from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.tiles.model import TileIndex

from .banding import check_tensor, plan_bands
from .bands import DIRECT_MIN, PAGE, Band, Part, direct_shifts
from .ranges import FetchPlan, bridge_factor, plan_fetch, priced

__all__ = [
    "DIRECT_MIN",
    "PAGE",
    "Band",
    "Batch",
    "Part",
    "PlaneSlice",
    "ReadSchedule",
    "check_tensor",
    "schedule_reads",
]


@dataclass(frozen=True, slots=True)
class PlaneSlice:
    """Rows ``[row0, row1)`` x byte columns ``[col0, col1)`` of tensor ``tensor`` (physical bytes)."""

    tensor: str
    row0: int
    row1: int
    col0: int
    col1: int

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, byte columns)`` of the result."""
        return self.row1 - self.row0, self.col1 - self.col0

    @property
    def nbytes(self) -> int:
        """Bytes requested."""
        return (self.row1 - self.row0) * (self.col1 - self.col0)


@dataclass(frozen=True, slots=True)
class Batch:
    """Bands fetched, verified and materialized together; ``slots[k]`` is band k's staging offset.

    (-1 for a direct band.)
    """

    bands: tuple[Band, ...]
    slots: tuple[int, ...]
    staging_bytes: int
    fetch: FetchPlan


@dataclass(frozen=True, slots=True)
class ReadSchedule:
    """Everything a load reads, in order.

    ``slot_bytes`` is the staging one batch needs at most; ``bounce_bytes`` bounds a read holding a
    tiled band (a span, or one tile row run), which a local read takes through a bounce buffer: a batch's
    band bytes plus what its gap budget may bridge. ``shifts``: per slice whose result array is to start
    within a page so that a large direct band's whole pages line up with it (:func:`~.bands.direct_shifts`).
    """

    slices: tuple[PlaneSlice, ...]
    batches: tuple[Batch, ...]
    blobs: dict[str, str]
    slot_bytes: int
    largest_tile: int
    bounce_bytes: int = 0
    shifts: dict[int, int] = field(default_factory=dict)

    @property
    def bytes_assigned(self) -> int:
        """Bytes of the requested rectangles."""
        return sum(s.nbytes for s in self.slices)

    @property
    def bytes_fetched(self) -> int:
        """Bytes read from storage (tile bytes plus bridged gaps)."""
        return sum(b.fetch.bytes for b in self.batches)

    @property
    def requests(self) -> int:
        """Reads issued (S3 requests; local ``preadv`` calls before splitting at ``IOV_MAX``)."""
        return sum(b.fetch.requests for b in self.batches)

    @property
    def tiles(self) -> int:
        """Tiles read and verified."""
        return sum((band.i1 - band.i) * (band.j1 - band.j0) for b in self.batches for band in b.bands)


def _round_page(n: int) -> int:
    return -(-n // PAGE) * PAGE


def schedule_reads(
    slices: Sequence[PlaneSlice],
    tensors: Iterable[TensorEntry],
    files: Iterable[FileEntry],
    index: TileIndex,
    *,
    batch_bytes: int = 16 << 20,
    max_gap: int = 0,
    gap_budget: float = 0.0,
    request_bytes: int = 0,
    max_amplification: float = 1.0,
) -> ReadSchedule:
    """Plan the reads for ``slices`` (see the module docstring). Raises the loader's named errors.

    ``max_gap``, ``gap_budget``, ``request_bytes`` and ``max_amplification`` are the fetch planner's
    (:func:`~.ranges.plan_fetch`).

    The cyclic garbage collector is paused meanwhile: planning builds thousands of small acyclic
    records, and the collections they triggered (each walking every live object) doubled its time.
    """
    with paused_gc():
        gaps = _Gaps(max_gap, gap_budget, request_bytes, max_amplification)
        return _schedule(slices, tensors, files, index, batch_bytes, gaps)


@dataclass(frozen=True, slots=True)
class _Gaps:
    """The fetch planner's knobs (:func:`~.ranges.plan_fetch`)."""

    max_gap: int
    gap_budget: float
    request_bytes: int
    max_amplification: float

    def plan(self, bands: Sequence[Band]) -> FetchPlan:
        return plan_fetch(
            bands,
            max_gap=self.max_gap,
            gap_budget=self.gap_budget,
            request_bytes=self.request_bytes,
            max_amplification=self.max_amplification,
        )

    def weight(self, band: Band) -> int:
        """The bytes ``band`` counts for in its batch: its extent where its rows are one range."""
        whole = priced(
            band,
            max_gap=self.max_gap,
            request_bytes=self.request_bytes,
            max_amplification=self.max_amplification,
        )
        return band.extent if whole else band.nbytes

    @property
    def factor(self) -> float:
        """The most bytes a plan reads per band byte."""
        return bridge_factor(self.gap_budget, self.request_bytes, self.max_amplification)


def _schedule(
    slices: Sequence[PlaneSlice],
    tensors: Iterable[TensorEntry],
    files: Iterable[FileEntry],
    index: TileIndex,
    batch_bytes: int,
    gaps: _Gaps,
) -> ReadSchedule:
    by_path = {f.path: f for f in files}
    batches: list[Batch] = []
    group: list[Band] = []
    size = largest = 0
    for _, same_rows in groupby(plan_bands(slices, tensors, by_path, index, batch_bytes), key=_tile_rows):
        # a band read whole (priced requests) holds its extent in memory
        unit = [(band, gaps.weight(band)) for band in same_rows]
        need = sum(weight for _, weight in unit)
        # narrow bands of the same tile rows (a node's ranks splitting them by columns) are one range
        # when read together, a request per band and run when a batch boundary splits them
        narrow = len(unit) > 1 and not all(band.contiguous for band, _ in unit)
        if group and narrow and size + need > batch_bytes >= need:
            batches.append(_batch(group, gaps))
            group, size = [], 0
        for band, weight in unit:
            largest = max(largest, min(band.rows, band.row_block) * min(band.col_block, band.row_bytes))
            if group and size + weight > batch_bytes:
                batches.append(_batch(group, gaps))
                group, size = [], 0
            group.append(band)
            size += weight
    if group:
        batches.append(_batch(group, gaps))
    blobs = {band.file: by_path[band.file].digest for b in batches for band in b.bands}
    slot = max((b.staging_bytes for b in batches), default=0)
    # A local read takes a span holding a tiled band whole into a bounce buffer (a narrow tiled band run
    # by run). The loader may re-plan part of a batch (bands not in the page cache): any span of any
    # subset stays within the batch's band bytes times the planner's factor (1 + the gap budget locally).
    bounce = 0
    for b in batches:
        if any(band.tile_width for band in b.bands):
            bounce = max(bounce, int(sum(band.nbytes for band in b.bands) * gaps.factor))
    shifts = direct_shifts(band for b in batches for band in b.bands)
    return ReadSchedule(tuple(slices), tuple(batches), blobs, slot, largest, bounce, shifts)


def _tile_rows(band: Band) -> tuple[str, int, int]:
    """Bands of the same tile rows of a tensor: adjacent in band order, their runs side by side."""
    return band.tensor, band.i, band.i1


def _batch(bands: list[Band], gaps: _Gaps) -> Batch:
    slots, at = [], 0
    for band in bands:
        if band.direct >= 0:
            slots.append(-1)
            continue
        # A large contiguous band starts in its slot where it starts in its page of the file, so its
        # whole pages can be read there with O_DIRECT (which needs memory and file offsets aligned).
        at = _round_page(at) + (band.offset % PAGE if band.contiguous and band.nbytes >= DIRECT_MIN else 0)
        slots.append(at)
        at += band.nbytes
    fetch = gaps.plan(bands)
    return Batch(tuple(bands), tuple(slots), _round_page(at), fetch)
