"""The per-rank read ledger: what a load asked for, what it read, verified and held, and where time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class StageSeconds:
    """Seconds per stage. ``plan`` and ``total`` are wall time; the others are summed over workers."""

    plan: float
    fetch: float
    verify: float
    materialize: float
    total: float


@dataclass(frozen=True, slots=True)
class FetchedRange:
    """``count`` runs of ``length`` bytes of ``file`` were read, the first at ``offset``, ``stride`` apart."""

    file: str
    offset: int
    length: int
    stride: int = 0
    count: int = 1

    def overlaps(self, file: str, offset: int, length: int) -> bool:
        """Whether any byte of ``[offset, offset + length)`` of ``file`` was read."""
        if file != self.file or length <= 0 or self.length <= 0:
            return False
        if self.count == 1 or self.stride == 0:
            return self.offset < offset + length and offset < self.offset + self.length
        first = max(
            0, -(-(offset - self.length + 1 - self.offset) // self.stride)
        )  # runs ending after offset
        last = min(
            self.count - 1, (offset + length - 1 - self.offset) // self.stride
        )  # runs starting before end
        return first <= last


@dataclass(frozen=True, slots=True)
class ReadLedger:
    """One rank's read account (JSON-able with :meth:`to_json`).

    ``bytes_assigned``: bytes of the requested rectangles; ``bytes_fetched``: bytes read from storage
    (whole tiles plus bridged gaps; of a batch partly served from the page cache, its cached bands plus
    what its other bands' own plan read) and ``fetched`` their ranges; ``read_amplification`` =
    fetched / assigned (1.0 when nothing was assigned); ``requests``: reads issued (planned; a batch
    served from the page cache through a mapping, counted in ``page_cache_batches``, issues none;
    ``page_cache_bytes`` counts every band so served; a band that lands whole in its result array is
    always read with ``preadv`` or ``O_DIRECT``, cached or not);
    ``peak_staging_bytes``: most staging (and, on S3, response) bytes held at once, never above
    ``staging_bound_bytes``; ``scratch_bytes``: the fixed per-worker gather buffers (and, locally, the
    gap sink and the per-worker bounce buffers of tiled reads); ``tiles``: per tensor, the flat indices
    ``i * grid_cols + j`` of the tiles read and verified;
    ``fetched``: the ranges read, adjacent ones merged, a band read row by row as one strided record
    (empty unless recorded);
    ``mapped_bound_bytes``: the most page-cache pages the page-cache path has touched and still mapped
    at once (per worker, the largest mapping group's extent, :func:`~.sources.map_groups`; they count
    in RSS but are the page cache's, not new memory);
    ``direct_bytes``: bytes read with ``O_DIRECT`` (cold local spans: whole pages, not left in the
    page cache);
    ``page_amplification``: the distinct pages those ranges touch (what a device reads at the least,
    readahead off) over ``bytes_assigned`` — above ``read_amplification`` where one rank's row pieces are
    smaller than a page, which a node's shared read brings back to ~1 (None unless recorded);
    ``retries``: range requests re-sent after a transient failure (S3: a reset, a truncated body, a 5xx;
    the bytes of a retried range are verified like any other).
    """

    backend: str
    bytes_assigned: int
    bytes_fetched: int
    read_amplification: float
    requests: int
    tiles_verified: int
    bytes_verified: int
    page_cache_batches: int
    page_cache_bytes: int
    peak_staging_bytes: int
    staging_bound_bytes: int
    scratch_bytes: int
    seconds: StageSeconds
    tiles: dict[str, tuple[int, ...]]
    fetched: tuple[FetchedRange, ...]
    page_amplification: float | None = None
    mapped_bound_bytes: int = 0
    direct_bytes: int = 0
    retries: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``fetched`` as ``[file, offset, length, stride, count]`` lists)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # shallow: asdict would deep-copy
        out["seconds"] = asdict(self.seconds)  # every fetched range and tile index, to replace them after
        out["fetched"] = [[r.file, r.offset, r.length, r.stride, r.count] for r in self.fetched]
        out["tiles"] = {name: list(v) for name, v in sorted(self.tiles.items())}
        return out

    def touched(self, file: str, offset: int, length: int) -> bool:
        """Whether any byte of ``[offset, offset + length)`` of ``file`` was read (needs ``fetched``)."""
        return any(r.overlaps(file, offset, length) for r in self.fetched)


def merge_ranges(ranges: list[FetchedRange]) -> tuple[FetchedRange, ...]:
    """Sort, and merge touching or overlapping single ranges (strided records are kept as they are)."""
    out: list[FetchedRange] = []
    for r in sorted(ranges, key=lambda r: (r.file, r.offset)):
        last = out[-1] if out else None
        single = r.count == 1 and last is not None and last.count == 1
        if single and last is not None and last.file == r.file and r.offset <= last.offset + last.length:
            end = max(last.offset + last.length, r.offset + r.length)
            out[-1] = FetchedRange(r.file, last.offset, end - last.offset)
        else:
            out.append(r)
    return tuple(out)


def paged_bytes(ranges: tuple[FetchedRange, ...], page: int = 4096) -> int:
    """Bytes of the distinct ``page``-sized pages of each file that ``ranges`` touch.

    Vectorized per file (a column-split rank's strided records hold ~10^5 runs: a loop over them cost
    more than half of a warm 512 MiB load): each run's first and last page, sorted by first page, each
    counted from past the furthest page any earlier run reached.
    """
    firsts: dict[str, list[npt.NDArray[np.int64]]] = {}
    lasts: dict[str, list[npt.NDArray[np.int64]]] = {}
    for r in ranges:
        if r.length <= 0:
            continue
        starts = r.offset + np.arange(r.count if r.stride else 1, dtype=np.int64) * r.stride
        firsts.setdefault(r.file, []).append(starts // page)
        lasts.setdefault(r.file, []).append((starts + r.length - 1) // page)
    total = 0
    for file, parts in firsts.items():
        a, b = np.concatenate(parts), np.concatenate(lasts[file])
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        reached = np.concatenate(([np.int64(-1)], np.maximum.accumulate(b)[:-1]))
        total += int(np.maximum(b - np.maximum(a, reached + 1) + 1, 0).sum())
    return total * page
