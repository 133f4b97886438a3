"""Topology validation, rank numbering, and the ep / pp assignments (one source of truth each)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardport import ShardportError
from shardport.placement import (
    PlacementError,
    Topology,
    TopologyError,
    expert_owner,
    experts_of,
    layers_of,
    stage_of_layer,
)


def test_rank_numbering_is_tp_fastest_then_ep_then_pp():
    topo = Topology(tp=2, ep=3, pp=2)
    assert topo.world_size == 12
    seen = []
    for rank in range(topo.world_size):
        at = topo.coords(rank)
        assert rank == (at.pp_stage * topo.ep + at.ep_rank) * topo.tp + at.tp_rank
        assert topo.rank_of(at.pp_stage, at.ep_rank, at.tp_rank) == rank
        seen.append((at.pp_stage, at.ep_rank, at.tp_rank))
    assert seen == sorted(seen)
    assert topo.coords(5).pp_stage == 0 and topo.coords(6).pp_stage == 1


def test_dp_replicas_repeat_the_world():
    topo = Topology(tp=2, pp=2, dp=3)
    assert topo.replica_of(0) == (0, 0)
    assert topo.replica_of(9) == (2, 1)
    with pytest.raises(TopologyError, match=r"outside 0\.\.11"):
        topo.replica_of(12)


@pytest.mark.parametrize("kwargs", [{"tp": 0}, {"tp": 2, "ep": -1}, {"tp": 1, "pp": True}, {"tp": 1.5}])
def test_degrees_must_be_positive_integers(kwargs):
    with pytest.raises(TopologyError, match="must be a positive integer") as info:
        Topology(**kwargs)
    assert info.value.exit_code == 2
    assert isinstance(info.value, PlacementError) and isinstance(info.value, ShardportError)


def test_coords_out_of_range_shows_the_world_size():
    with pytest.raises(TopologyError, match=r"tp\*ep\*pp = 2\*1\*2 = 4"):
        Topology(tp=2, pp=2).coords(4)


def test_expert_blocks_are_contiguous_and_balanced():
    assert [expert_owner(e, 8, 3) for e in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [experts_of(r, 8, 3) for r in range(3)] == [range(0, 3), range(3, 6), range(6, 8)]
    with pytest.raises(TopologyError, match="ep=9 > 8 experts"):
        expert_owner(0, 8, 9)


def test_stages_hold_contiguous_layers():
    assert [layers_of(s, 5, 2) for s in range(2)] == [range(0, 3), range(3, 5)]
    with pytest.raises(TopologyError, match="pp=4 > 3 layers"):
        stage_of_layer(0, 3, 4)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_assignments_cover_each_item_exactly_once(case):
    count, parts = case
    for owner, blocks in ((expert_owner, experts_of), (stage_of_layer, layers_of)):
        held = [i for part in range(parts) for i in blocks(part, count, parts)]
        assert held == list(range(count))
        sizes = [len(blocks(part, count, parts)) for part in range(parts)]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        for part in range(parts):
            assert all(owner(i, count, parts) == part for i in blocks(part, count, parts))
