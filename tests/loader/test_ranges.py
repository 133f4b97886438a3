"""Fetch plans: bands become spans and row reads that preserve the union, within the gap budget."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardport.loader.ranges import bridge_factor, gap_threshold, plan_fetch, priced
from shardport.loader.schedule import Band
from shardport.loader.sources import Dest, LocalBlobSource, group_extent, map_groups
from shardport.placement import Piece
from shardport.registry.store.keys import blob_key
from shardport.registry.store.local import LOCAL_MAX_GAP
from shardport.registry.store.protocol import Store
from shardport.registry.store.s3 import S3_PROFILE

FILES = {name: random.Random(name).randbytes(40_000) for name in ("a", "b")}
DIGESTS = {name: f"sha256:{k:064x}" for k, name in enumerate(FILES, start=1)}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A local store holding the two files as blobs (named by made-up digests)."""
    out = Store(str(tmp_path_factory.mktemp("ranges") / "store"))
    for name, data in FILES.items():
        out.put(blob_key(DIGESTS[name]), data)
    return out


@st.composite
def bands(draw: st.DrawFn) -> list[Band]:
    """Disjoint bands of a few row-major tensors, like the schedule makes them."""
    out: list[Band] = []
    for file in ("a", "b"):
        at = draw(st.integers(0, 50))
        for _ in range(draw(st.integers(0, 3))):
            rows, row_bytes = draw(st.integers(1, 12)), draw(st.integers(1, 90))
            rb, cb = draw(st.integers(1, rows)), draw(st.integers(1, row_bytes))
            for i in range(-(-rows // rb)):
                picked = [j for j in range(-(-row_bytes // cb)) if draw(st.booleans())]
                for _, run in itertools.groupby(enumerate(picked), key=lambda x: x[1] - x[0]):
                    js = [j for _, j in run]
                    r0, r1 = i * rb, min((i + 1) * rb, rows)
                    # a run may go to several slices (a node's ranks): side-by-side bands of one tile row
                    cuts = sorted(set(draw(st.lists(st.sampled_from(js), max_size=2))) - {js[0]})
                    for a, b in itertools.pairwise([js[0], *cuts, js[-1] + 1]):
                        c0, c1 = a * cb, min(b * cb, row_bytes)
                        out.append(Band.rect("t", file, at, row_bytes, i, a, b, r0, r1, c0, c1, -1, 0, 0, ()))
            at += rows * row_bytes + draw(st.integers(0, 40))
    return sorted(out, key=lambda b: (b.file, b.offset))


PRICES = st.sampled_from([(0, 1.0), (0, 8.0), (40, 3.0), (1 << 20, 8.0), (1 << 20, 1.5)])
"""``(request_bytes, max_amplification)``: unpriced (local stores), and priced as on S3 or cheaper."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bs=bands(), max_gap=st.integers(0, 200), budget=st.sampled_from([0.0, 0.02, 0.3, 10.0]), price=PRICES)
def test_fetch_plan_reads_every_band_once_and_bridges_within_budget(
    store: Store, bs: list[Band], max_gap: int, budget: float, price: tuple[int, float]
) -> None:
    request_bytes, amplification = price
    plan = plan_fetch(
        bs, max_gap=max_gap, gap_budget=budget, request_bytes=request_bytes, max_amplification=amplification
    )
    seen = [k for s in plan.spans for k, _ in s.members] + list(plan.row_bands)
    assert sorted(seen) == [k for k, b in enumerate(bs) if b.nbytes]  # each band exactly once
    for s in plan.spans:
        first = min(bs[k].offset for k, _ in s.members)
        last = max(bs[k].offset + bs[k].extent for k, _ in s.members)
        assert (s.offset, s.end) == (first, last)  # spans start and end on requested bytes
        for k, at in s.members:
            assert bs[k].file == s.file and s.offset + at == bs[k].offset
    ordered = sorted(plan.spans, key=lambda s: (s.file, s.offset))
    for x, y in itertools.pairwise(ordered):
        assert x.file != y.file or x.end < y.offset
    requested = sum(b.nbytes for b in bs)
    assert plan.bytes == sum(s.length for s in plan.spans) + sum(bs[k].nbytes for k in plan.row_bands)
    factor = bridge_factor(budget, request_bytes, amplification)
    assert plan.bytes <= factor * requested + 1e-9
    if request_bytes == 0:
        assert plan.bytes - requested <= budget * requested + 1e-9
        assert plan == plan_fetch(bs, max_gap=max_gap, gap_budget=budget)  # unpriced: the budget's plan
    for k, b in enumerate(bs):  # a band whose rows are worth a range never goes row by row
        if priced(b, max_gap=max_gap, request_bytes=request_bytes, max_amplification=amplification):
            assert k not in plan.row_bands
    assert plan.requests == len(plan.spans) + sum(bs[k].rows for k in plan.row_bands)
    # the real local source fills every band's destination with exactly its bytes
    buf = memoryview(bytearray(sum(b.nbytes for b in bs) + 1))
    dests, at = [], 0
    for b in bs:
        dests.append(Dest(buf, at, b.width, b.rows, b.width))
        at += b.nbytes
    source = LocalBlobSource(store, DIGESTS)
    try:
        source.fetch(plan, bs, dests)
    finally:
        source.close()
    for b, d in zip(bs, dests, strict=True):
        matrix = np.frombuffer(FILES[b.file], np.uint8, b.rows * b.row_bytes, b.start + b.row0 * b.row_bytes)
        expected = matrix.reshape(b.rows, b.row_bytes)[:, b.col0 : b.col1]
        assert np.array_equal(d.array(), expected)


@settings(max_examples=150, deadline=None)
@given(
    bs=bands(),
    max_gap=st.integers(0, 200),
    budget=st.sampled_from([0.0, 0.02, 0.3, 10.0]),
    price=PRICES,
    data=st.data(),
)
def test_a_read_of_any_part_of_a_batch_stays_within_its_bytes_plus_the_gap_budget(
    bs: list[Band], max_gap: int, budget: float, price: tuple[int, float], data: st.DataObject
) -> None:
    # the loader re-plans the bands of a batch that are not in the page cache; the bounce buffer for
    # tiled reads is sized by this bound (ReadSchedule.bounce_bytes), not by the whole batch's plan
    part = [b for b in bs if data.draw(st.booleans())]
    request_bytes, amplification = price
    plan = plan_fetch(
        part, max_gap=max_gap, gap_budget=budget, request_bytes=request_bytes, max_amplification=amplification
    )
    bound = sum(b.nbytes for b in bs) * bridge_factor(budget, request_bytes, amplification)
    assert all(s.length <= bound for s in plan.spans)
    assert all(part[k].nbytes <= bound for k in plan.row_bands)


def _column_piece(tp: int, rank: int, rows: int = 64, row_bytes: int = 480, *, start: int = 0) -> Band:
    """Rank ``rank``'s byte columns of every row of a row-major ``rows`` x ``row_bytes`` tensor (K-split)."""
    c0, c1 = rank * row_bytes // tp, (rank + 1) * row_bytes // tp
    return Band.rect("t", "a", start, row_bytes, 0, 0, 1, 0, rows, c0, c1, -1, 0, 0, ())


LOCAL = {"max_gap": LOCAL_MAX_GAP, "gap_budget": 0.02}
S3 = {
    "max_gap": S3_PROFILE.max_gap,
    "gap_budget": 0.02,
    "request_bytes": S3_PROFILE.request_bytes,
    "max_amplification": S3_PROFILE.max_amplification,
}


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_row_major_column_pieces_are_one_request_on_s3_and_a_run_per_row_locally(tp: int) -> None:
    # a rank's part of every row of two tensors (tp-way K-splits): on S3 a request costs more than the
    # gaps between the rows, so each tensor's rows are one range; locally a run is a preadv iovec
    bands = [_column_piece(tp, 1), _column_piece(tp, 1, start=64 * 480 + 100_000)]
    needed = sum(b.nbytes for b in bands)
    local = plan_fetch(bands, **LOCAL)
    assert local.row_bands == (0, 1) and local.requests == 128 and local.bytes == needed
    s3 = plan_fetch(bands, **S3)
    assert s3.row_bands == () and s3.requests == 2
    assert [(s.offset, s.length) for s in s3.spans] == [(b.offset, b.extent) for b in bands]
    assert s3.bytes == sum(b.extent for b in bands) <= tp * needed  # the gaps are read, and counted
    # unpriced, the same bands under the S3 gap limit keep to the 2% budget: a run per row
    assert plan_fetch(bands, **{**S3, "request_bytes": 0}).requests == 128


def test_request_pricing_stops_at_the_amplification_cap_the_request_cost_and_tiled_bands() -> None:
    thin = _column_piece(16, 1)  # reading its rows whole would read ~16x its bytes
    assert plan_fetch([thin], **S3).requests == thin.runs
    assert plan_fetch([thin], **{**S3, "max_amplification": 16.0}).requests == 1
    wide = _column_piece(4, 1, rows=8, row_bytes=4 << 20)  # gaps of 3 MiB: a request costs less
    assert plan_fetch([wide], **{**S3, "max_gap": 8 << 20}).requests == wide.runs
    assert plan_fetch([wide], **{**S3, "max_gap": 8 << 20, "request_bytes": 4 << 20}).requests == 1
    # a tiled tensor's band: its runs are tile rows (already few); they keep to the gap budget
    piece = _column_piece(4, 1)
    tiled = piece._replace(i1=4, tile_width=piece.width, stride=16 * piece.row_bytes)
    assert tiled.runs == 4 and not tiled.contiguous
    plan = plan_fetch([tiled], **S3)
    assert plan.row_bands == (0,) and plan.requests == 4 and plan.bytes == tiled.nbytes


def test_gap_threshold_bridges_smallest_gaps_first() -> None:
    pieces = [Piece("f", o, 100) for o in (0, 110, 300, 1000)]  # gaps 10, 90, 600
    assert gap_threshold(pieces, max_gap=10_000, allowance=0) == 0
    assert gap_threshold(pieces, max_gap=10_000, allowance=10) == 10
    assert gap_threshold(pieces, max_gap=10_000, allowance=100) == 90
    assert gap_threshold(pieces, max_gap=50, allowance=10_000) == 10


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bs=bands(), limit=st.sampled_from([1, 300, 5_000, 1 << 20]))
def test_mapped_groups_cover_every_band_once_within_the_limit_and_views_hold_the_file_bytes(
    store: Store, bs: list[Band], limit: int
) -> None:
    groups = map_groups(bs, limit)
    members = sorted(k for g in groups for k in g)
    assert members == [k for k, b in enumerate(bs) if b.nbytes]
    for g in groups:
        assert len({bs[k].file for k in g}) == 1
        assert len(g) == 1 or group_extent(bs, g) <= limit
    source = LocalBlobSource(store, DIGESTS)
    try:
        mapped = source.map_cached(bs, limit)
        assert mapped.mapped_groups == len(groups)
        for k, b in enumerate(bs):
            view = mapped.arrays[k]
            data = np.frombuffer(FILES[b.file], np.uint8)
            if b.nbytes:  # just written: in the page cache
                assert view is not None
                want = np.lib.stride_tricks.as_strided(data[b.offset :], (b.rows, b.width), (b.stride, 1))
                assert np.array_equal(view, want)
            mapped.release(k)
            assert mapped.arrays[k] is None
        assert mapped.mapped_groups == 0  # every group unmapped once its last band was released
        mapped.close()
    finally:
        source.close()


def test_a_band_inside_a_wide_band_does_not_stretch_its_group_past_the_limit() -> None:
    wide = Band.rect("t", "a", 0, 4000, 0, 0, 1, 0, 3, 0, 10, -1, 0, 0, ())  # 3 rows of 10 bytes: extent 8010
    inside = Band.rect("u", "a", 100, 10, 0, 0, 1, 0, 1, 0, 10, -1, 0, 0, ())  # one row at offset 100
    assert wide.extent == 8010 and inside.offset == 100
    assert map_groups([wide, inside], 5000) == [[0], [1]]
    assert map_groups([wide, inside], 9000) == [[0, 1]]


def test_narrow_bands_whose_runs_interleave_into_one_region_are_one_range(store: Store) -> None:
    # four column quarters of the same 3 rows (40 bytes each), as a node's ranks read a tensor together
    quarters = [
        Band.rect("t", "a", 100, 40, 0, k, k + 1, 0, 3, 10 * k, 10 * (k + 1), k, 0, 0, ()) for k in range(4)
    ]
    plan = plan_fetch(quarters, max_gap=0, gap_budget=0.0)
    assert plan.row_bands == () and plan.requests == 1 and plan.bytes == 120
    assert [(s.offset, s.length) for s in plan.spans] == [(100, 120)]
    outs = [np.zeros((3, 10), np.uint8) for _ in quarters]
    dests = [Dest(out.reshape(-1).data, 0, 10, 3, 10) for out in outs]
    source = LocalBlobSource(store, DIGESTS)
    try:
        source.fetch(plan, quarters, dests)
    finally:
        source.close()
    matrix = np.frombuffer(FILES["a"], np.uint8)[100:220].reshape(3, 40)
    for k, out in enumerate(outs):
        assert np.array_equal(out, matrix[:, 10 * k : 10 * (k + 1)])
    # three of the four leave a gap in every row: read row by row as before (no gap allowed here)
    partial = plan_fetch(quarters[:3], max_gap=0, gap_budget=0.0)
    assert partial.row_bands == (0, 1, 2) and partial.requests == 9
    # runs side by side that do not fill the stride are not one region either
    spaced = [quarters[0], quarters[2]]
    assert plan_fetch(spaced, max_gap=0, gap_budget=0.0).requests == 6


def test_a_thread_keeps_one_bounce_buffer_replacing_it_when_it_must_grow(store: Store) -> None:
    source = LocalBlobSource(store, DIGESTS)
    try:
        small = source._bounce(10_000)
        assert small.nbytes >= 10_000 and source._bounce(5_000) is small  # reused while large enough
        big = source._bounce(100_000)
        assert big.nbytes >= 100_000 and len(source._bounce_maps) == 1  # the small one was unmapped
        with pytest.raises(ValueError):
            small[0]  # released
    finally:
        source.close()
    assert source._bounce_maps == []
