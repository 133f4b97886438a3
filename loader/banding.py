"""Banding (pure): the requested slices' tiles → bands, each direct (into one slice) or staged.

Every tile a slice touches is read whole, so that it can be verified; a tile several slices touch is
read once. A band whose tiles all lie inside one slice is *direct*: its bytes are read straight into
that slice's result array (no staging, no second copy). Any other band (a tile cut by a slice edge, or
shared) is *staged*: read into its batch's staging slot and copied out (its :class:`~.bands.Part` s)
after it verified. A whole tile row of a row-major tensor wanted by several slices (the ranks of a node
loading together, each holding a column slice) is read as whole matrix rows, in staged bands of at most
``batch_bytes`` (one contiguous read when the tile row fits), every byte read once for all of them,
instead of one narrow strided band per slice (whose rows each cost a request, and whose pages the
device reads whole anyway). Bands never exceed ``batch_bytes`` unless a single tile does.

A tile row is cut into *strips* (:data:`Strip`: adjacent tile columns with the same destination); they depend
only on which slices touch which of its tile columns and whether each holds all of its rows; adjacent
tile rows planned alike are *stacked* (:class:`_Stack`) into one band of several tile rows, in either
layout, as long as the stack spans at most ``batch_bytes`` of whole matrix rows. Each band's landing
(:mod:`.bands`: destination pitch, whether it scatters into its parts) is decided here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardport.registry.artifact.manifest import FileEntry, TensorEntry
from shardport.registry.tiles.errors import TileGridError
from shardport.registry.tiles.grid import tiles_mismatch
from shardport.registry.tiles.layout import tile_offset
from shardport.registry.tiles.model import TensorTiles, TileIndex, tile_span

from .bands import Band, Part, scatters
from .errors import IndexMismatchError, SliceRequestError

if TYPE_CHECKING:
    from .schedule import PlaneSlice


def check_tensor(entry: TensorEntry, tiles: TensorTiles, files: dict[str, FileEntry]) -> None:
    """Raise :class:`IndexMismatchError` unless ``tiles`` describes ``entry``'s bytes exactly."""
    problem = tiles_mismatch(entry, tiles, files)
    if problem is not None:
        raise IndexMismatchError(
            f"tensor {entry.name!r}: {problem}; the tile index belongs to another artifact — "
            "re-resolve the manifest"
        )


def plan_bands(
    slices: Sequence[PlaneSlice],
    tensors: Iterable[TensorEntry],
    files: dict[str, FileEntry],
    index: TileIndex,
    limit: int,
) -> list[Band]:
    """The bands covering ``slices``' tiles, each at most ``limit`` bytes, in (file, offset) order.

    Each tensor is first checked against its tile index and ``files`` (by path; :func:`check_tensor`).
    """
    grids: dict[str, _Grid] = {}
    wanted = _wanted(slices, {t.name: t for t in tensors}, files, index, grids)
    return _bands(wanted, grids, slices, limit)


Touch = tuple[int, int, int, int, int]
"""Slice ``k`` touches tile rows ``[i0, i1)`` x tile columns ``[j0, j1)``: ``(i0, i1, j0, j1, k)``."""
RowTouch = tuple[int, int, int]
"""A touch within one tile row: slice ``k`` touches its tile columns ``[j0, j1)``: ``(j0, j1, k)``."""


def _wanted(
    slices: Sequence[PlaneSlice],
    tensors: dict[str, TensorEntry],
    files: dict[str, FileEntry],
    index: TileIndex,
    grids: dict[str, _Grid],
) -> dict[str, list[Touch]]:
    """Tensor → the tiles each slice touches, in slice order (slices touching no tile left out).

    Each tensor is checked against its tile index once, and its grid put in ``grids``.
    """
    wanted: dict[str, list[Touch]] = {}
    for k, s in enumerate(slices):
        entry, tiles = tensors.get(s.tensor), index.tensors.get(s.tensor)
        if entry is None or tiles is None:
            lacks = "the manifest" if entry is None else "the tile index"
            raise SliceRequestError(f"slice {k}: tensor {s.tensor!r} is not in {lacks}")
        if s.tensor not in grids:
            check_tensor(entry, tiles, files)
            grids[s.tensor] = _Grid.of(s.tensor, tiles)
        try:
            i0, i1, j0, j1 = tile_span(tiles, s.row0, s.row1, s.col0, s.col1)
        except TileGridError as exc:
            raise SliceRequestError(f"slice {k} of tensor {s.tensor!r}: {exc}") from exc
        if j0 < j1 and i0 < i1:
            wanted.setdefault(s.tensor, []).append((i0, i1, j0, j1, k))
    return wanted


@dataclass(frozen=True, slots=True)
class _Grid:
    """A tensor's tile grid, read off its :class:`TensorTiles` once per schedule."""

    name: str
    file: str
    start: int
    rows: int
    row_bytes: int
    rb: int
    cb: int
    grid_cols: int
    tiled: bool

    @classmethod
    def of(cls, name: str, tiles: TensorTiles) -> _Grid:
        return cls(
            name,
            tiles.file,
            tiles.start,
            tiles.rows,
            tiles.row_bytes,
            tiles.row_block,
            tiles.col_block,
            tiles.grid_cols,
            tiles.layout == "tiled",
        )


def _band(
    g: _Grid,
    i: int,
    i1: int,
    r0: int,
    r1: int,
    j0: int,
    j1: int,
    direct: int,
    slices: Sequence[PlaneSlice],
    users: Iterable[int],
) -> Band:
    """Tiles ``(i..i1-1, j0..j1-1)`` (rows ``[r0, r1)``) for slice ``direct``, or staged for ``users``.

    Where it lands is decided here: a direct band at its place in the slice's array (rows the slice's
    width apart), a staged one whole in a slot, straight into its parts when they take its tiles whole.
    """
    col0, col1 = j0 * g.cb, min(j1 * g.cb, g.row_bytes)
    width = col1 - col0
    tile_width = 0
    if not g.tiled:
        origin, stride = g.start + r0 * g.row_bytes + col0, g.row_bytes
    else:  # tile rows, each its tiles of one width (_strips) one after the other, a tile row apart
        origin = g.start + tile_offset(g.rows, g.row_bytes, g.rb, g.cb, i, j0)
        stride, tile_width = g.rb * g.row_bytes, width // (j1 - j0)
    out_row = out_col = 0
    parts: tuple[Part, ...] = ()
    scatter = False
    if direct >= 0:
        s = slices[direct]
        out_row, out_col, pitch = r0 - s.row0, col0 - s.col0, s.col1 - s.col0
    else:
        parts, pitch = tuple(_parts(r0, r1, col0, col1, slices, users)), width
        scatter = scatters(parts, r1 - r0, width, g.cb)
    return Band(
        g.name, g.file, g.start, g.row_bytes, i, i1, j0, j1, r0, r1, col0, col1, direct, out_row, out_col,
        parts, origin, stride, r1 - r0, width, (r1 - r0) * width, pitch, g.rb, g.cb, scatter, tile_width,
    )  # fmt: skip


def _parts(
    r0: int, r1: int, col0: int, col1: int, slices: Sequence[PlaneSlice], users: Iterable[int]
) -> Iterator[Part]:
    """What each of ``users`` takes from the staged rectangle rows ``[r0, r1)`` x bytes ``[col0, col1)``."""
    for k in sorted(users):
        s = slices[k]
        a = r0 if r0 > s.row0 else s.row0
        b = r1 if r1 < s.row1 else s.row1
        c = col0 if col0 > s.col0 else s.col0
        d = col1 if col1 < s.col1 else s.col1
        if a < b and c < d:
            yield Part(k, a - r0, b - r0, c - col0, d - col0, a - s.row0, c - s.col0)


def _covers(row_touches: list[RowTouch], n: int) -> bool:
    """Whether the row touches ``(j0, j1, k)`` together cover tile columns ``[0, n)``."""
    reach = 0
    for j0, j1, _ in sorted(row_touches):
        if j0 > reach:
            return False
        reach = max(reach, j1)
    return reach >= n


def _strips(g: _Grid, r0: int, r1: int, j0: int, j1: int, limit: int) -> list[tuple[int, int]]:
    """Tile columns ``[j0, j1)`` of a tile row (rows ``[r0, r1)``) in strips of at most ``limit`` bytes.

    A single tile may exceed ``limit``. A tiled tensor's narrower last tile column is a strip of its own
    (a strip's tiles share one width).
    """
    if j1 - j0 == 1:
        return [(j0, j1)]
    cb, row_bytes = g.cb, g.row_bytes
    if g.tiled and j1 == g.grid_cols and row_bytes % cb:
        return [*_strips(g, r0, r1, j0, j1 - 1, limit), (j1 - 1, j1)]
    width = limit // (r1 - r0) if r1 > r0 else row_bytes
    if min(j1 * cb, row_bytes) - j0 * cb <= width:
        return [(j0, j1)]
    out = []
    while j0 < j1:
        end = j0 + 1
        while end < j1 and min((end + 1) * cb, row_bytes) - j0 * cb <= width:
            end = min(j1, max(end + 1, (j0 * cb + width) // cb))
        out.append((j0, end))
        j0 = end
    return out


def _one_slice_strips(
    g: _Grid, r0: int, r1: int, touch: RowTouch, covered: bool, s: PlaneSlice, limit: int
) -> list[RowTouch]:
    """Strips ``(j0, j1, direct)`` of a tile row that one slice ``s`` alone touches.

    The tile row holds matrix rows ``[r0, r1)``; ``touch`` gives the slice's tile columns, ``covered``
    whether the slice holds all of the tile row's rows. Only the slice's edge tiles can be cut (staged,
    direct -1); the others go to it directly (direct k).
    """
    j0, j1, k = touch
    segments: list[RowTouch] = []
    if not covered:
        segments.append((j0, j1, -1))
    else:
        first = j0 + (0 if s.col0 <= j0 * g.cb else 1)
        last = j1 - (0 if min(j1 * g.cb, g.row_bytes) <= s.col1 else 1)
        if first > j0:
            segments.append((j0, first, -1))
        if last > first:
            segments.append((first, last, k))
        if j1 > max(last, first):
            segments.append((max(last, first), j1, -1))
    merged: list[RowTouch] = segments[:1]
    for seg in segments[1:]:  # both edge tiles of a two-tile touch may be cut: one staged strip, as in _bands
        if merged[-1][2] == seg[2] == -1:
            merged[-1] = (merged[-1][0], seg[1], -1)
        else:
            merged.append(seg)
    return [(a, b, d) for start, stop, d in merged for a, b in _strips(g, r0, r1, start, stop, limit)]


Strip = tuple[int, int, int, Iterable[int]]
"""A band's tile columns ``[j0, j1)``, ``direct`` (the slice it goes to directly, or -1: staged) and its
users (the slices that take from it)."""


class _Stack:
    """Tile rows ``[i0, i1)`` (matrix rows ``[r0, r1)``) of one tensor that share one plan of strips."""

    __slots__ = ("g", "i0", "i1", "key", "r0", "r1", "strips")

    def __init__(self, g: _Grid, i: int, r0: int, r1: int, key: object, strips: list[Strip]) -> None:
        self.g, self.i0, self.i1, self.r0, self.r1, self.key, self.strips = g, i, i + 1, r0, r1, key, strips

    def extends(self, i: int, r1: int, key: object, limit: int) -> bool:
        """Take tile row ``i`` (ending at matrix row ``r1``) if it is the next one and plans the same.

        The stack's rows may span at most ``limit`` bytes of the file (whole matrix rows), so that a
        stacked band's extent — what a page-cache mapping of it covers — stays within one batch.
        """
        if i != self.i1 or key != self.key or (r1 - self.r0) * self.g.row_bytes > limit:
            return False
        self.i1, self.r1 = i + 1, r1
        return True

    def bands(self, slices: Sequence[PlaneSlice]) -> Iterator[Band]:
        for a, b, direct, users in self.strips:
            yield _band(self.g, self.i0, self.i1, self.r0, self.r1, a, b, direct, slices, users)


def _bands(
    wanted: dict[str, list[Touch]],
    grids: dict[str, _Grid],
    slices: Sequence[PlaneSlice],
    limit: int,
) -> list[Band]:
    """Bands: strips of adjacent tiles with the same destination, at most ``limit`` bytes each.

    A tile row's strips depend only on which slices touch which of its tile columns and whether each
    holds all of its rows; adjacent tile rows planned alike (the common case: slices holding whole tile
    rows) are stacked into one band of several tile rows, and a plan is made once per distinct shape.
    """
    out: list[Band] = []
    for name, touches in wanted.items():
        g = grids[name]
        if len(touches) == 1:
            out += _one_slice_bands(g, touches[0], slices, limit)
        else:
            out += _shared_bands(g, touches, slices, limit)
    out.sort(key=lambda b: (b.file, b.origin))
    return out


def _one_slice_bands(g: _Grid, touch: Touch, slices: Sequence[PlaneSlice], limit: int) -> Iterator[Band]:
    """Bands of a tensor that one slice alone touches.

    Only its first and last tile rows can be cut by the slice (or be the tensor's short last tile row),
    so its tile rows fall into at most three classes, each planned once and stacked.
    """
    i0, i1, j0, j1, k = touch
    s = slices[k]
    only = (k,)
    rb, rows = g.rb, g.rows
    segments: list[list[int]] = []  # [first, end, covered, height]
    for a, b in ((i0, i0 + 1), (i0 + 1, i1 - 1), (i1 - 1, i1)) if i1 - i0 > 1 else ((i0, i1),):
        if a >= b:
            continue
        r0, r1 = a * rb, min(a * rb + rb, rows)
        covered, height = int(s.row0 <= r0 and r1 <= s.row1), r1 - r0
        if segments and segments[-1][2:] == [covered, height]:
            segments[-1][1] = b
        else:
            segments.append([a, b, covered, height])
    depth = max(1, limit // (rb * g.row_bytes))  # tile rows a stack may hold (whole matrix rows ≤ limit)
    for a, b, covered, height in segments:
        strips = _one_slice_strips(g, a * rb, a * rb + height, (j0, j1, k), bool(covered), s, limit)
        for ia in range(a, b, depth):
            ib = min(ia + depth, b)
            r0, r1 = ia * rb, min(ib * rb, rows)
            for x, y, direct in strips:
                yield _band(g, ia, ib, r0, r1, x, y, direct, slices, only)


def _shared_bands(g: _Grid, touches: list[Touch], slices: Sequence[PlaneSlice], limit: int) -> list[Band]:
    """Bands of a tensor that several slices touch: planned tile row by tile row, alike rows stacked."""
    touches_of: dict[int, list[RowTouch]] = {}
    for i0, i1, j0, j1, k in touches:
        for i in range(i0, i1):
            touches_of.setdefault(i, []).append((j0, j1, k))
    out: list[Band] = []
    plans: dict[object, list[Strip]] = {}  # the same for most tile rows
    stack: _Stack | None = None
    for i in sorted(touches_of):
        row_touches = touches_of[i]
        r0 = i * g.rb
        r1 = min(r0 + g.rb, g.rows)
        key: object
        if len(row_touches) == 1:
            k = row_touches[0][2]
            s = slices[k]
            covered = s.row0 <= r0 and r1 <= s.row1
            key = (k, covered, r1 - r0)
            planned = plans.get(key)
            if planned is None:
                only = (k,)
                strips = _one_slice_strips(g, r0, r1, row_touches[0], covered, s, limit)
                planned = plans[key] = [(a, b, direct, only) for a, b, direct in strips]
        else:
            covers = tuple(slices[k].row0 <= r0 and r1 <= slices[k].row1 for _, _, k in row_touches)
            key = (tuple(row_touches), covers, r1 - r0)
            planned = plans.get(key)
            if planned is None:
                planned = plans[key] = _shared_strips(g, r0, r1, row_touches, slices, limit)
        if stack is not None and stack.extends(i, r1, key, limit):
            continue
        if stack is not None:
            out += stack.bands(slices)
        stack = _Stack(g, i, r0, r1, key, planned)
    if stack is not None:
        out += stack.bands(slices)
    return out


def _shared_strips(
    g: _Grid, r0: int, r1: int, row_touches: list[RowTouch], slices: Sequence[PlaneSlice], limit: int
) -> list[Strip]:
    """Strips of a tile row (matrix rows ``[r0, r1)``) that several slices touch (``row_touches``).

    A row-major tile row wanted whole by several slices is read as whole rows (one staged band when
    it fits ``limit``); otherwise strips of adjacent tiles with the same destination.
    """
    cb, row_bytes = g.cb, g.row_bytes
    sharing = {k for _, _, k in row_touches}
    if not g.tiled and g.grid_cols > 1 and len(sharing) > 1 and _covers(row_touches, g.grid_cols):
        whole = _strips(g, r0, r1, 0, g.grid_cols, limit)
        if len(whole) == 1:  # one staged band (a band inside one slice would need one user)
            return [(0, g.grid_cols, -1, sharing)]
    else:
        whole = []
    columns: dict[int, list[int]] = {}
    for j0, j1, k in row_touches:
        for j in range(j0, j1):
            columns.setdefault(j, []).append(k)
    out: list[Strip] = []
    if whole:  # whole rows, in strips of at most `limit`
        for a, b in whole:
            users = {k for j in range(a, b) for k in columns[j]}
            s = slices[next(iter(users))]
            inside = (
                len(users) == 1
                and all(len(columns[j]) == 1 for j in range(a, b))
                and s.row0 <= r0
                and r1 <= s.row1
                and s.col0 <= a * cb
                and min(b * cb, row_bytes) <= s.col1
            )
            out.append((a, b, next(iter(users)) if inside else -1, users))
        return out
    strip: list[int] = []
    direct, users = -2, set[int]()
    for j in sorted(columns):
        c0, c1 = j * cb, min((j + 1) * cb, row_bytes)
        ks = columns[j]
        s = slices[ks[0]]
        inside = len(ks) == 1 and s.row0 <= r0 and r1 <= s.row1 and s.col0 <= c0 and c1 <= s.col1
        this = ks[0] if inside else -1
        too_big = bool(strip) and (r1 - r0) * (c1 - strip[0] * cb) > limit
        narrow = g.tiled and c1 - c0 < cb  # a tiled band's tiles share one width
        if strip and (this != direct or j != strip[-1] + 1 or too_big or narrow):
            out.append((strip[0], strip[-1] + 1, direct, users))
            strip, users = [], set()
        strip.append(j)
        users.update(ks)
        direct = this
    if strip:
        out.append((strip[0], strip[-1] + 1, direct, users))
    return out
