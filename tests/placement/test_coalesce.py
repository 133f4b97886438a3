"""Coalescing keeps the union of requested bytes and fetches outside it only the gaps it bridged."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport.placement import Piece, PieceError, coalesce
from shardport.placement.coalesce import measure_runs


def _bytes(pieces):
    return {(p.file, b) for p in pieces for b in range(p.offset, p.end)}


def test_merges_touching_and_overlapping_and_bridges_small_gaps():
    pieces = [Piece("a", 10, 5), Piece("a", 0, 10), Piece("a", 12, 10), Piece("a", 30, 4), Piece("b", 0, 1)]
    exact = coalesce(pieces)
    assert [(r.file, r.offset, r.length) for r in exact.ranges] == [("a", 0, 22), ("a", 30, 4), ("b", 0, 1)]
    assert exact.requested_bytes == exact.fetched_bytes == 27 and exact.amplification == 1.0
    bridged = coalesce(pieces, max_gap=8)
    assert [(r.offset, r.length) for r in bridged.ranges] == [(0, 34), (0, 1)]
    assert bridged.bridged_bytes == 8 and bridged.requests == 2
    assert bridged.placements[2] == (0, 12) and bridged.placements[4] == (1, 0)


def test_empty_and_invalid_pieces():
    assert coalesce([]).requests == 0 and coalesce([]).amplification == 1.0
    with pytest.raises(PieceError, match="length 0"):
        Piece("a", 0, 0)
    with pytest.raises(PieceError, match="offset -1"):
        Piece("a", -1, 3)
    with pytest.raises(PieceError, match="max_gap -1"):
        coalesce([Piece("a", 0, 1)], max_gap=-1)


pieces_strategy = st.lists(
    st.builds(Piece, st.sampled_from(["x", "y"]), st.integers(0, 400), st.integers(1, 40)), max_size=30
)


@settings(max_examples=150, deadline=None)
@given(pieces_strategy, st.integers(0, 32))
def test_coalescing_preserves_the_union_and_only_bridges_gaps(pieces, max_gap):
    result = coalesce(pieces, max_gap)
    requested, fetched = _bytes(pieces), _bytes(result.ranges)
    assert requested <= fetched
    assert result.requested_bytes == len(requested)
    assert result.fetched_bytes == len(fetched) == sum(r.length for r in result.ranges)
    extra = fetched - requested
    for file, byte in extra:  # every extra byte sits in a gap of at most max_gap between requested bytes
        before = [b for f, b in requested if f == file and b < byte]
        after = [b for f, b in requested if f == file and b > byte]
        assert before and after and min(after) - max(before) - 1 <= max_gap
    ordered = sorted((r.file, r.offset, r.end) for r in result.ranges)
    assert ordered == [(r.file, r.offset, r.end) for r in result.ranges]
    for (f1, _, end), (f2, start, _) in itertools.pairwise(ordered):
        assert f1 != f2 or start - end > max_gap
    for piece, (index, offset) in zip(pieces, result.placements, strict=True):
        fetched_range = result.ranges[index]
        assert fetched_range.file == piece.file
        assert fetched_range.offset + offset == piece.offset and piece.end <= fetched_range.end


runs_strategy = st.lists(
    st.tuples(
        st.sampled_from(["x", "y"]),
        st.integers(0, 300),
        st.integers(1, 12),
        st.integers(0, 20),
        st.integers(1, 6),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(runs_strategy, st.integers(0, 24), st.booleans())
def test_measuring_runs_equals_coalescing_their_pieces(raw, max_gap, disjoint):
    runs, cursor = [], {"x": 0, "y": 0}
    for file, offset, length, extra, count in raw:
        if disjoint:  # lay runs one after another, as the disjoint tensors of an inventory are
            offset = cursor[file] + offset % 7
            cursor[file] = offset + (count - 1) * (length + extra) + length
        runs.append((file, offset, length, length + extra if count > 1 else length, count))
    pieces = [Piece(f, o + i * s, n) for f, o, n, s, c in runs for i in range(c)]
    expected = coalesce(pieces, max_gap)
    assert measure_runs(runs, max_gap) == (
        expected.requested_bytes,
        expected.fetched_bytes,
        expected.requests,
    )
