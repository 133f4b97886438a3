"""Fetch plans: how a batch's bands become reads, with small gaps bridged within a budget.

A band is ``rows`` runs of ``width`` bytes in its file, ``stride`` apart from ``origin``
(:class:`~.schedule.Band`). A *contiguous* band (``stride == width``: whole matrix rows of a row-major
tensor, a single row, or any single tile of a tiled tensor) is one file range. A narrow band (a column
slice of several rows of a row-major tensor) is either read row by row, or, when its gap
``stride - width`` is at most ``max_gap`` and the budget allows, as one range with the gaps read and
dropped. Contiguous ranges of different bands are then merged by :func:`shardport.placement.coalesce`
(the project's one coalescer), bridging the gaps between them smallest first; touching ranges always
merge, so the adjacent tiles of a tiled tensor that one batch reads become one request. Everything
bridged in a batch stays within ``gap_budget x`` the batch's band bytes, so bridging alone never raises
read amplification by more than ``gap_budget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from typing import TYPE_CHECKING

from shardport.placement import Piece, coalesce

if TYPE_CHECKING:
    from .schedule import Band


@dataclass(frozen=True, slots=True)
class Span:
    """One contiguous read of ``file``; ``members`` are (band index, band's first byte - ``offset``)."""

    file: str
    offset: int
    length: int
    members: tuple[tuple[int, int], ...]

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """A batch's reads: ``spans``, and the bands read one row per request (``row_bands``)."""

    spans: tuple[Span, ...]
    row_bands: tuple[int, ...]
    bytes: int
    requests: int


def gap_threshold(pieces: Sequence[Piece], *, max_gap: int, allowance: float) -> int:
    """The largest gap to bridge: all gaps ≤ it are bridged, each ≤ ``max_gap``, their sum ≤ ``allowance``."""
    return _threshold(coalesce(pieces, 0).ranges, max_gap, allowance)


def _threshold(merged: Sequence[Piece], max_gap: int, allowance: float) -> int:
    """:func:`gap_threshold` from the pieces already merged at gap 0 (sorted, touching ones joined)."""
    gaps = sorted(
        b.offset - a.end for a, b in pairwise(merged) if a.file == b.file and 0 < b.offset - a.end <= max_gap
    )
    bridged = threshold = 0
    for value, same in groupby(gaps):
        cost = value * sum(1 for _ in same)
        if bridged + cost > allowance:
            break
        bridged += cost
        threshold = value
    return threshold


def plan_fetch(bands: Sequence[Band], *, max_gap: int, gap_budget: float) -> FetchPlan:
    """Decide spans and row-by-row reads for ``bands`` (see the module docstring)."""
    allowance = gap_budget * sum(b.nbytes for b in bands)
    live = [k for k, b in enumerate(bands) if b.nbytes > 0]
    spannable = [k for k in live if bands[k].contiguous]
    narrow = sorted((bands[k].stride - bands[k].width, k) for k in live if not bands[k].contiguous)
    rows_only = []
    for gap, k in narrow:
        cost = gap * (bands[k].rows - 1)
        if gap <= max_gap and cost <= allowance:
            allowance -= cost
            spannable.append(k)
        else:
            rows_only.append(k)
    spannable.sort()
    pieces = [Piece(bands[k].file, bands[k].offset, bands[k].extent) for k in spannable]
    merged = coalesce(pieces, 0)  # touching pieces always merge; gaps are bridged only when affordable
    threshold = _threshold(merged.ranges, max_gap, allowance) if len(merged.ranges) > 1 and max_gap > 0 else 0
    if threshold:
        merged = coalesce(pieces, threshold)
    members: list[list[tuple[int, int]]] = [[] for _ in merged.ranges]
    for k, (r, at) in zip(spannable, merged.placements, strict=True):
        members[r].append((k, at))
    spans = tuple(
        Span(r.file, r.offset, r.length, tuple(sorted(m, key=lambda x: x[1])))
        for r, m in zip(merged.ranges, members, strict=True)
    )
    row_bands = tuple(sorted(rows_only))
    total = merged.fetched_bytes + sum(bands[k].nbytes for k in row_bands)
    requests = len(spans) + sum(bands[k].rows for k in row_bands)
    return FetchPlan(spans, row_bands, total, requests)
