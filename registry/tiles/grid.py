"""Tile grid choice: how a tensor's bytes are cut into tiles (pure; see :mod:`.tiles` for the spec).

With *cuts* (:class:`.splits.PlaneCuts`, given by push for every plane of a weight): along each axis
the block divides the gcd of the axis's split points and is a multiple of its unit (no minimum: a small
tensor is cut at its split points too); without points, any multiple of the unit. Among those pairs the
largest tile ≤ ``target`` wins, ties going to the wider, whole rows when the columns have no points; if
none is ≤ ``target``, the smallest. Without cuts, the generic rule below.

A tensor is a physical byte matrix of ``rows`` x ``row_bytes``; the column *quantum* ``q`` is the
smallest byte unit that is never split (the element size, rounded up to whole bytes for sub-byte
dtypes: 1 for F4, 3 for F6; bytes per block for GGUF block types). :func:`plan_grid` returns
``(row_block, col_block)`` (rows, bytes).

Choice, per axis of length ``n`` (rows, or quanta per row): the alignment ``L`` is the largest of
:data:`LADDER` dividing ``n``; a block must divide ``n / L`` so that every split into tp ∈ {2, 3, 4,
6, 8, 12, 24} equal parts with ``tp | n`` lands on tile boundaries (the block count is a multiple of
``L``); with ``L = 1`` the axis is free (any block, the last one ragged). Among the aligned
``(row_block, col_block)`` pairs the largest tile ≤ ``target`` that is ≥ ``minimum`` wins, ties going to
the wider tile (fewer pieces per tile); when none is ≤ ``target``, the smallest one ≥ ``minimum``.
When even the largest aligned tile is below ``minimum`` the alignment is relaxed one step at a time
(first dropping the factor 3, then halving: 24 → 8 → 4 → 2 → 1), fewest steps first, keeping the
larger product of alignments, then the row alignment. A tensor of at most ``minimum`` bytes is one tile.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.formats.gguf_gate import GGML_TYPES
from shardport.registry.formats.safetensors_gate import DTYPE_BITS
from shardport.registry.tiles.errors import TileGridError
from shardport.registry.tiles.splits import AxisCuts, PlaneCuts

if TYPE_CHECKING:
    from shardport.registry.tiles.model import TensorTiles

LADDER = (24, 12, 8, 6, 4, 3, 2, 1)
"""Alignment ladder: an axis is cut into a multiple of the first of these that divides its length."""

DEFAULT_TARGET = 1 << 20
DEFAULT_MINIMUM = 64 << 10
_BLOCK_TYPES = {name: (block, size) for name, block, size in GGML_TYPES.values()}
_FREE_CANDIDATES = 4096


@dataclass(frozen=True, slots=True)
class PlaneLayout:
    """A tensor seen as a byte matrix: ``rows`` x ``row_bytes``, columns cut only at ``quantum``."""

    rows: int
    row_bytes: int
    quantum: int

    @property
    def nbytes(self) -> int:
        """Total bytes."""
        return self.rows * self.row_bytes


@dataclass(frozen=True, slots=True)
class GridChoice:
    """A chosen grid and the alignment it keeps (``row_align`` / ``col_align`` from :data:`LADDER`)."""

    row_block: int
    col_block: int
    row_align: int
    col_align: int


_LAYOUTS: dict[tuple[str, tuple[int, ...], int], PlaneLayout] = {}
"""Layouts already computed, by (dtype, shape, bytes): all a layout depends on (models repeat shapes)."""
_LAYOUTS_MAX = 4096


def plane_layout(entry: TensorEntry) -> PlaneLayout:
    """Rows, row bytes and quantum of ``entry``; :class:`TileGridError` if its byte count is inconsistent."""
    key = (entry.dtype, entry.shape, entry.end - entry.start)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _plane_layout(entry)
        if len(_LAYOUTS) < _LAYOUTS_MAX:
            _LAYOUTS[key] = layout
    return layout


def _plane_layout(entry: TensorEntry) -> PlaneLayout:
    nbytes = entry.end - entry.start
    elements = math.prod(entry.shape)
    if entry.dtype in DTYPE_BITS:
        bits = DTYPE_BITS[entry.dtype]
        quantum = math.lcm(bits, 8) // 8
        expected = elements * bits / 8
    elif entry.dtype in _BLOCK_TYPES:
        block, quantum = _BLOCK_TYPES[entry.dtype]
        if entry.shape and entry.shape[-1] % block:
            raise TileGridError(
                f"{entry.file}: tensor {entry.name!r}: {entry.dtype} rows hold {entry.shape[-1]} elements, "
                f"not a multiple of the block size {block}"
            )
        expected = elements / block * quantum
    else:
        raise TileGridError(
            f"{entry.file}: tensor {entry.name!r}: dtype {entry.dtype!r} has no known element or block size; "
            "expected a safetensors dtype or a ggml type name"
        )
    if expected != nbytes:
        raise TileGridError(
            f"{entry.file}: tensor {entry.name!r}: shape {list(entry.shape)} of {entry.dtype} is "
            f"{expected:g} bytes, but its range [{entry.start}, {entry.end}) holds {nbytes}"
        )
    rows = entry.shape[0] if len(entry.shape) >= 2 else 1
    row_bytes = nbytes // rows if rows else 0
    if rows and (row_bytes * rows != nbytes or row_bytes % quantum):
        raise TileGridError(
            f"{entry.file}: tensor {entry.name!r}: a row of {nbytes}/{rows} bytes is not a whole number of "
            f"{quantum}-byte quanta; such a tensor cannot be tiled"
        )
    return PlaneLayout(rows=rows, row_bytes=row_bytes, quantum=quantum)


def alignment(n: int) -> int:
    """The largest :data:`LADDER` value dividing ``n`` (1 for ``n <= 0``)."""
    return next(v for v in LADDER if n > 0 and n % v == 0) if n > 0 else 1


def relaxations(align: int) -> list[int]:
    """``align`` and its relaxations: the factor 3 dropped first, then halved down to 1."""
    out = [align]
    if align % 3 == 0:
        out.append(align // 3)
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return list(dict.fromkeys(out))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class _Axis:
    """Block sizes allowed on one axis of ``length`` units at alignment ``align``."""

    def __init__(self, length: int, align: int) -> None:
        self.length = length
        self.free = align == 1
        self.values = [] if self.free else _divisors(length // align)
        self.largest = length if self.free else self.values[-1]

    def at_most(self, limit: int) -> int | None:
        """The largest allowed block ≤ ``limit``."""
        if self.free:
            return min(limit, self.length) if limit >= 1 else None
        k = bisect.bisect_right(self.values, limit)
        return self.values[k - 1] if k else None

    def at_least(self, limit: int) -> int | None:
        """The smallest allowed block ≥ ``limit``."""
        if self.free:
            return max(limit, 1) if limit <= self.length else None
        k = bisect.bisect_left(self.values, limit)
        return self.values[k] if k < len(self.values) else None

    def candidates(self) -> Iterator[int]:
        """Blocks to try (for a free axis: one per tile count up to a cap, and the powers of two)."""
        if not self.free:
            yield from self.values
            return
        n = self.length
        counts = range(1, min(n, _FREE_CANDIDATES) + 1)
        yield from sorted({-(-n // k) for k in counts} | {1 << p for p in range(n.bit_length())})


def _best(rows: _Axis, cols: _Axis, quantum: int, target: int, minimum: int) -> tuple[int, int] | None:
    """The pair per the module rule, or None when no aligned tile reaches ``minimum``."""
    below: tuple[int, int, int, int] | None = None  # (bytes, width, rb, cb)
    above: tuple[int, int, int, int] | None = None  # (bytes, -width, rb, cb)
    for units in cols.candidates():
        width = units * quantum
        rb = rows.at_most(target // width)
        if rb is not None and rb * width >= minimum:
            key = (rb * width, width, rb, width)
            below = key if below is None or key > below else below
        rb = rows.at_least(-(-minimum // width))
        if rb is not None:
            key = (rb * width, -width, rb, width)
            above = key if above is None or key < above else above
    pick = below or above
    return (pick[2], pick[3]) if pick else None


def choose_grid(
    layout: PlaneLayout,
    *,
    target: int = DEFAULT_TARGET,
    minimum: int = DEFAULT_MINIMUM,
    cuts: PlaneCuts | None = None,
) -> GridChoice:
    """Grid and kept alignment for ``layout`` (see the module docstring for the rule)."""
    if target < 1 or minimum < 1:
        raise TileGridError(f"tile target {target} and minimum {minimum} must be positive")
    if cuts is not None:
        return _cut_grid(layout, cuts, target)
    rows, row_bytes, q = layout.rows, layout.row_bytes, layout.quantum
    if layout.nbytes <= minimum:
        return GridChoice(max(rows, 1), max(row_bytes, 1), 1, 1)
    quanta = row_bytes // q
    pairs = [
        (kr + kc, -(ar * ac), -ar, ar, ac)
        for kr, ar in enumerate(relaxations(alignment(rows)))
        for kc, ac in enumerate(relaxations(alignment(quanta)))
    ]
    for *_, ar, ac in sorted(pairs):
        row_axis, col_axis = _Axis(rows, ar), _Axis(quanta, ac)
        if row_axis.largest * col_axis.largest * q < minimum:
            continue
        best = _best(row_axis, col_axis, q, target, minimum)
        if best is not None:
            return GridChoice(best[0], best[1], ar, ac)
    return GridChoice(rows, row_bytes, 1, 1)  # unreachable: the free/free pair always fits


def plan_grid(
    entry: TensorEntry,
    *,
    target: int = DEFAULT_TARGET,
    minimum: int = DEFAULT_MINIMUM,
    cuts: PlaneCuts | None = None,
) -> tuple[int, int]:
    """``(row_block, col_block)`` for ``entry``: rows per tile and bytes per tile row."""
    choice = choose_grid(plane_layout(entry), target=target, minimum=minimum, cuts=cuts)
    return choice.row_block, choice.col_block


def _cut_blocks(length: int, axis: AxisCuts) -> list[int]:
    """Blocks along an axis of ``length`` units whose boundaries hit every point and keep the unit.

    With points: the divisors of their gcd that are multiples of the unit (if the unit does not divide
    the gcd, the points win). Without: multiples of the unit (one per tile count up to a cap) and the
    whole axis.
    """
    if length <= 0:
        return [1]
    unit = max(1, axis.unit)
    points = [p for p in axis.points if 0 < p < length]
    if points:
        g = math.gcd(*points)
        found = [d for d in _divisors(g) if d % unit == 0]
        return found or _divisors(g)
    units = -(-length // unit)
    counts = range(1, min(units, _FREE_CANDIDATES) + 1)
    return sorted({min(length, unit * -(-units // k)) for k in counts} | {length})


def _cut_grid(layout: PlaneLayout, cuts: PlaneCuts, target: int) -> GridChoice:
    """The largest tile ≤ ``target`` (ties to the wider) among blocks that honour ``cuts``.

    If every such tile is larger, the smallest. ``row_align`` / ``col_align`` report the units kept.
    """
    rows, row_bytes, q = layout.rows, layout.row_bytes, layout.quantum
    if layout.nbytes == 0:
        return GridChoice(max(rows, 1), max(row_bytes, 1), 1, 1)
    row_blocks = _cut_blocks(rows, cuts.rows)
    col_blocks = _cut_blocks(row_bytes // q, cuts.cols)
    if not cuts.cols.points and row_blocks[0] * row_bytes <= target:  # whole rows: contiguous tiles
        col_blocks = [row_bytes // q]
    below: tuple[int, int, int, int] | None = None
    above: tuple[int, int, int, int] | None = None
    for units in col_blocks:
        width = units * q
        k = bisect.bisect_right(row_blocks, target // width)
        if k:
            rb = row_blocks[k - 1]
            key = (rb * width, width, rb, width)
            below = key if below is None or key > below else below
        key = (row_blocks[0] * width, -width, row_blocks[0], width)
        above = key if above is None or key < above else above
    pick = below or above
    assert pick is not None  # col_blocks is never empty
    return GridChoice(pick[2], pick[3], max(1, cuts.rows.unit), max(1, cuts.cols.unit))


def tiles_mismatch(entry: TensorEntry, tiles: TensorTiles, files: Mapping[str, FileEntry]) -> str | None:
    """Why ``tiles`` (a tile index entry) does not describe ``entry``'s bytes exactly, or None.

    The one check a rank pull (the loader) and ``verify REF`` make before trusting a tile index entry.
    """
    try:
        layout = plane_layout(entry)
    except TileGridError as exc:
        return f"the manifest entry cannot be tiled: {exc}"
    found = (tiles.file, tiles.start, tiles.end, tiles.rows, tiles.row_bytes)
    wanted = (entry.file, entry.start, entry.end, layout.rows, layout.row_bytes)
    if found != wanted:
        return f"tile index has (file, start, end, rows, row_bytes) = {found}, the manifest {wanted}"
    if entry.layout not in ("row_major", "shardport-tiled"):
        return f"layout {entry.layout!r} in the manifest; rank pulls read row_major and shardport-tiled"

    def describe(grid: tuple[int | None, int | None] | None) -> str:
        return "row_major" if grid is None else f"tiled ({grid[0]} rows x {grid[1]} bytes per tile)"

    found_grid = (tiles.row_block, tiles.col_block) if tiles.layout == "tiled" else None
    wanted_grid = (entry.tile_rows, entry.tile_cols) if entry.layout == "shardport-tiled" else None
    if found_grid != wanted_grid:
        return f"the manifest stores it {describe(wanted_grid)}, the tile index {describe(found_grid)}"
    file = files.get(entry.file)
    if file is None or entry.end > file.size:
        size = "missing" if file is None else f"{file.size} bytes"
        return f"lies in {entry.file} ({size} in the manifest's files)"
    return None
