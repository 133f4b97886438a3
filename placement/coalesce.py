"""Coalescing byte pieces into fetch ranges.

:func:`coalesce` merges pieces of the same file whose gap is at most ``max_gap`` bytes (overlapping and
touching pieces always merge). The fetched ranges cover the union of the requested bytes; the only
bytes fetched outside it are the gaps bridged, and every range starts and ends on requested bytes.
``placements[i]`` says where input piece ``i`` lies: ``(range index, offset inside that range)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import PieceError


@dataclass(frozen=True, slots=True)
class Piece:
    """A byte range of a file: ``[offset, offset + length)``."""

    file: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise PieceError(
                f"piece of {self.file}: offset {self.offset}, length {self.length}; offsets are >= 0 and "
                "lengths >= 1"
            )

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class Coalesced:
    """Fetch ranges for a set of pieces, and where each piece lies in them."""

    ranges: tuple[Piece, ...]
    placements: tuple[tuple[int, int], ...]
    requested_bytes: int
    fetched_bytes: int

    @property
    def requests(self) -> int:
        """Number of ranges to fetch."""
        return len(self.ranges)

    @property
    def bridged_bytes(self) -> int:
        """Bytes fetched that no piece asked for (the gaps bridged)."""
        return self.fetched_bytes - self.requested_bytes

    @property
    def amplification(self) -> float:
        """``fetched / requested`` (1.0 when nothing was requested)."""
        return self.fetched_bytes / self.requested_bytes if self.requested_bytes else 1.0


def merge_spans(
    spans: Sequence[tuple[str, int, int]], max_gap: int
) -> tuple[list[tuple[str, int, int]], list[int], int]:
    """Merge ``(file, offset, end)`` spans; return ranges, each span's range index, union bytes."""
    if max_gap < 0:
        raise PieceError(f"max_gap {max_gap} must be >= 0")
    n = len(spans)
    in_order = all(spans[i][:2] <= spans[i + 1][:2] for i in range(n - 1))  # the usual case: no sort
    order = range(n) if in_order else sorted(range(n), key=lambda i: (spans[i][0], spans[i][1]))
    ranges: list[tuple[str, int, int]] = []
    owner = [0] * n
    union = 0
    file: str | None = None
    first = last = covered = 0
    for i in order:
        f, start, end = spans[i]
        if f == file and start - last <= max_gap:
            if end > last:
                last = end
        else:
            if file is not None:
                ranges.append((file, first, last))
            file, first, last, covered = f, start, end, start
        low = start if start > covered else covered
        if end > low:
            union += end - low
            covered = end
        owner[i] = len(ranges)
    if file is not None:
        ranges.append((file, first, last))
    return ranges, owner, union


def coalesce(pieces: Iterable[Piece], max_gap: int = 0) -> Coalesced:
    """Merge pieces whose gap is at most ``max_gap`` bytes (see the module docstring)."""
    items = list(pieces)
    spans = [(p.file, p.offset, p.end) for p in items]
    ranges, owner, union = merge_spans(spans, max_gap)
    fetched = [Piece(file, start, end - start) for file, start, end in ranges]
    placements = tuple((owner[i], p.offset - fetched[owner[i]].offset) for i, p in enumerate(items))
    return Coalesced(
        ranges=tuple(fetched),
        placements=placements,
        requested_bytes=union,
        fetched_bytes=sum(r.length for r in fetched),
    )


def measure_runs(runs: Iterable[tuple[str, int, int, int, int]], max_gap: int) -> tuple[int, int, int]:
    """``(requested, fetched, requests)`` of coalescing strided runs, without expanding them.

    A run ``(file, offset, length, stride, count)`` stands for ``count`` pieces ``stride`` apart. The
    result equals :func:`coalesce` over the expanded pieces; runs that overlap each other (never the
    case for the disjoint tensors of a valid inventory) are measured by expanding them.
    """
    if max_gap < 0:
        raise PieceError(f"max_gap {max_gap} must be >= 0")
    ordered = sorted(runs)
    requested = fetched = requests = 0
    file: str | None = None
    start = end = 0
    for run_file, offset, length, stride, count in ordered:
        if run_file == file and offset < end:
            return _measure_expanded(ordered, max_gap)
        requested += count * length
        if run_file != file or offset - end > max_gap:
            if file is not None:
                fetched, requests = fetched + end - start, requests + 1
            file, start = run_file, offset
        last = offset + (count - 1) * stride
        if count > 1 and stride - length > max_gap:
            fetched, requests = fetched + offset + length - start, requests + 1
            fetched, requests = fetched + (count - 2) * length, requests + count - 2
            start = last
        end = last + length
    if file is not None:
        fetched, requests = fetched + end - start, requests + 1
    return requested, fetched, requests


def _measure_expanded(runs: Sequence[tuple[str, int, int, int, int]], max_gap: int) -> tuple[int, int, int]:
    spans = [(f, o + i * s, o + i * s + n) for f, o, n, s, c in runs for i in range(c)]
    ranges, _, union = merge_spans(spans, max_gap)
    return union, sum(e - s for _, s, e in ranges), len(ranges)
