"""Fetch plans: how a batch's bands become reads, with small gaps bridged within a budget.

A band is ``runs`` runs of ``run_bytes`` bytes in its file, ``stride`` apart from ``origin``
(:class:`~.bands.Band`). A *contiguous* band (``stride == run_bytes``: whole matrix rows of a
row-major tensor, a single row, or whole tile rows or a single tile row's tiles of a tiled tensor) is
one file range. A narrow band (a column slice of several rows of a row-major tensor, or of several tile
rows of a tiled one) is either read run by run, or, when its gap ``stride - run_bytes`` is at most
``max_gap`` and the budget allows, as one range with the gaps read and dropped; narrow bands whose
runs interleave into one region (a node's ranks splitting the same rows by columns) are one range.
Contiguous ranges of different bands are then merged by :func:`shardport.placement.merge_spans` (the
core of the project's one coalescer), bridging the gaps between them smallest first; touching ranges
always merge, so the adjacent tiles of a tiled tensor that one batch reads become one request.
Everything bridged in a batch stays within ``gap_budget x`` the batch's band bytes, so bridging alone
never raises read amplification by more than ``gap_budget``.

Where a request has a price (``request_bytes`` > 0: the bytes one request costs in time, about a
megabyte on S3, :attr:`~shardport.registry.store.protocol.ReadProfile.request_bytes`) the plan also
weighs requests against bytes (it minimises ``requests x request_bytes + bytes read``) where requests
grow with a tensor's rows: a narrow band of a row-major tensor that the budget leaves to be read run by
run (a rank's part of every matrix row: a K-split of a GGUF block plane, an N-split of a GPTQ plane) is
read as one range when its gap is under ``request_bytes`` (each gap read costs less than the request it
saves) and its extent is at most ``max_amplification x`` its bytes (:func:`priced`; about tp ≤
``max_amplification`` for an even split). Otherwise such a rank issues one GET per matrix row. A band
spans at most ``batch_bytes`` of whole matrix rows (or one tile row) and :mod:`.schedule` packs such
bands into batches by extent, so the responses a batch holds stay within ``batch_bytes``. Tiled bands
(runs are tile rows, at most the grid's rows; in a real checkpoint their gaps are whole tiles of about
``tile_target``) and gaps between ranges (one request each) stay the budget's, so row splits and tiled
reads keep their amplification. With ``request_bytes == 0`` (local stores, where a run costs a
``preadv`` iovec) plans are exactly the budget's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from typing import TYPE_CHECKING

from shardport.placement import Piece, merge_spans

if TYPE_CHECKING:
    from .bands import Band


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
    """A batch's reads: ``spans``, and the bands read one run per request (``row_bands``)."""

    spans: tuple[Span, ...]
    row_bands: tuple[int, ...]
    bytes: int
    requests: int


def gap_threshold(pieces: Sequence[Piece], *, max_gap: int, allowance: float) -> int:
    """The largest gap to bridge: all gaps ≤ it are bridged, each ≤ ``max_gap``, their sum ≤ ``allowance``."""
    merged, _, _ = merge_spans([(p.file, p.offset, p.end) for p in pieces], 0)
    return _threshold(merged, max_gap, allowance)


def _threshold(merged: Sequence[tuple[str, int, int]], max_gap: int, allowance: float) -> int:
    """:func:`gap_threshold` from ``(file, start, end)`` ranges merged at gap 0 (sorted, touching joined)."""
    gaps = sorted(b[1] - a[2] for a, b in pairwise(merged) if a[0] == b[0] and 0 < b[1] - a[2] <= max_gap)
    bridged = threshold = 0
    for value, same in groupby(gaps):
        cost = value * sum(1 for _ in same)
        if bridged + cost > allowance:
            break
        bridged += cost
        threshold = value
    return threshold


def _interleaved(
    bands: Sequence[Band], narrow: list[tuple[int, int]], spannable: list[int]
) -> list[tuple[int, int]]:
    """Move narrow bands whose runs interleave into one contiguous region to ``spannable``; return the rest.

    Bands of one file with the same stride and run count whose runs sit side by side and together fill
    each stride (the stacked tile rows of a tiled tensor split by columns among a node's ranks) read as
    one range with no gap: each band's gaps are the others' runs.
    """
    groups: dict[tuple[str, int, int], list[int]] = {}
    for _, k in narrow:
        b = bands[k]
        groups.setdefault((b.file, b.stride, b.runs), []).append(k)
    moved: set[int] = set()
    for (_, stride, _), members in groups.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda k: bands[k].origin)
        chain: list[int] = []
        end = -1
        for k in [*members, -1]:  # chains of bands whose first runs follow each other
            if k >= 0 and bands[k].origin == end:
                chain.append(k)
                end += bands[k].run_bytes
                continue
            if len(chain) > 1 and end - bands[chain[0]].origin == stride:
                moved.update(chain)
            if k >= 0:
                chain, end = [k], bands[k].origin + bands[k].run_bytes
    if not moved:
        return narrow
    spannable.extend(sorted(moved))
    return [(gap, k) for gap, k in narrow if k not in moved]


def bridge_factor(gap_budget: float, request_bytes: int = 0, max_amplification: float = 1.0) -> float:
    """The most bytes a plan of :func:`plan_fetch` reads per band byte (its bands' own and bridged gaps)."""
    return (max(1.0, max_amplification) if request_bytes > 0 else 1.0) + gap_budget


def priced(band: Band, *, max_gap: int, request_bytes: int, max_amplification: float) -> bool:
    """Whether ``band``'s runs are one range because requests have a price (see the module docstring).

    A narrow band of a row-major tensor whose gap is under ``request_bytes`` (and ``max_gap``), read
    whole: at most ``max_amplification x`` its bytes.
    """
    if request_bytes <= 0 or band.tile_width or band.contiguous or band.nbytes <= 0:
        return False
    gap = band.stride - band.run_bytes
    return gap < request_bytes and gap <= max_gap and band.extent <= max_amplification * band.nbytes


def plan_fetch(
    bands: Sequence[Band],
    *,
    max_gap: int,
    gap_budget: float,
    request_bytes: int = 0,
    max_amplification: float = 1.0,
) -> FetchPlan:
    """Decide spans and row-by-row reads for ``bands`` (see the module docstring).

    Bytes read stay within ``bridge_factor(gap_budget, request_bytes, max_amplification)`` x the band
    bytes; no gap over ``max_gap`` is bridged.
    """
    allowance = gap_budget * sum(b.nbytes for b in bands) if gap_budget else 0.0
    spannable: list[int] = []
    narrow: list[tuple[int, int]] = []
    for k, b in enumerate(bands):
        if b.nbytes > 0:
            if b.contiguous:
                spannable.append(k)
            else:
                narrow.append((b.stride - b.run_bytes, k))
    rows_only: list[int] = []
    if narrow:
        narrow = _interleaved(bands, narrow, spannable)
        for gap, k in sorted(narrow):
            cost = gap * (bands[k].runs - 1)
            if gap <= max_gap and cost <= allowance:
                allowance -= cost
                spannable.append(k)
            elif priced(
                bands[k], max_gap=max_gap, request_bytes=request_bytes, max_amplification=max_amplification
            ):  # reading the gaps costs less than the (runs - 1) requests it saves
                spannable.append(k)
            else:
                rows_only.append(k)
        spannable.sort()
        rows_only.sort()
    spans: tuple[Span, ...] = ()
    if spannable:
        pieces = [(b.file, b.origin, b.origin + b.extent) for b in (bands[k] for k in spannable)]
        ranges, owner, _ = merge_spans(pieces, 0)  # touching pieces always merge; gaps bridged if affordable
        threshold = _threshold(ranges, max_gap, allowance) if len(ranges) > 1 and max_gap > 0 else 0
        if threshold:
            ranges, owner, _ = merge_spans(pieces, threshold)
        members: list[list[tuple[int, int]]] = [[] for _ in ranges]
        for k, r in zip(spannable, owner, strict=True):
            members[r].append((k, bands[k].origin - ranges[r][1]))
        spans = tuple(
            Span(file, start, end - start, tuple(sorted(m, key=lambda x: x[1])) if len(m) > 1 else tuple(m))
            for (file, start, end), m in zip(ranges, members, strict=True)
        )
    total = requests = 0
    for s in spans:
        total += s.length
    for k in rows_only:
        total += bands[k].nbytes
        requests += bands[k].runs
    return FetchPlan(spans, tuple(rows_only), total, len(spans) + requests)
