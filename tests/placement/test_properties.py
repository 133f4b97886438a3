"""Property tests over random llama / MoE inventories (float, GPTQ, AWQ, GGUF) and topologies.

For every plan: each stage that needs a tensor covers it exactly once (split) or reads it whole
(replicated) — see ``placement_builders.check_plan``; split dims partition their extent; each expert is
held by exactly one ep rank; pp stages hold every layer exactly once; planning is deterministic.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from placement_builders import Shape, check_plan, inventory

from shardport.placement import Plan, Topology, TopologyError, UnsplittableError, expert_owner, plan


@st.composite
def cases(draw: st.DrawFn) -> tuple[Shape, str, int, Topology, int, int, int]:
    heads = draw(st.sampled_from([2, 4, 8]))
    experts = draw(st.sampled_from([0, 0, 2, 3, 4]))
    layers = draw(st.integers(1, 4))
    shape = Shape(
        layers=layers,
        heads=heads,
        kv_heads=draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0])),
        head_dim=draw(st.sampled_from([16, 32, 64])),
        intermediate=draw(st.sampled_from([64, 128, 192, 256, 384])),
        vocab=draw(st.integers(8, 80)),
        experts=experts,
        tied=draw(st.booleans()),
    )
    fmt = draw(st.sampled_from(["float", "gptq", "awq", "gguf"]))
    group = draw(st.sampled_from([32, 64, 128]))
    topology = Topology(
        tp=draw(st.sampled_from([1, 2, 3, 4, 8])),
        ep=draw(st.integers(1, experts)) if experts else 1,
        pp=draw(st.integers(1, layers)),
        dp=draw(st.integers(1, 2)),
    )
    files, pad = draw(st.integers(1, 3)), draw(st.sampled_from([0, 16]))
    return shape, fmt, group, topology, files, pad, draw(st.sampled_from([0, 8, 64, 4096]))


def _planned(case: tuple[Shape, str, int, Topology, int, int, int]) -> tuple[Any, Plan]:
    """The case's inventory and its full plan (cases no split can serve are rejected)."""
    shape, fmt, group, topology, files, pad, max_gap = case
    inv = inventory(shape, fmt, group=group, files=files, pad=pad)
    try:
        return inv, plan(inv, topology, max_gap=max_gap)
    except UnsplittableError:
        reject()


def _check_splits(result: Plan) -> None:
    for split in result.splits:
        if split.kind == "heads_replicated":
            assert all((b - a) == split.unit or (b - a) % split.unit == 0 for a, b in split.ranges)
            assert {a for a, _ in split.ranges} >= set(range(0, split.extent, split.ranges[0][1]))
            continue
        assert split.ranges[0][0] == 0 and split.ranges[-1][1] == split.extent
        for (_, end), (start, stop) in zip(split.ranges, split.ranges[1:], strict=False):
            assert end == start < stop and start % split.unit == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(cases())
def test_random_inventories_are_covered_exactly(case):
    shape, _, _, topology, _, _, max_gap = case
    inv, result = _planned(case)
    check_plan(result, inv)
    _check_splits(result)
    splits = {s.key: s for s in result.splits}
    for rank in result.ranks:
        for read in rank.reads:
            if read.split in splits:
                axis = "N" if read.rule != "row" else "K"
                bounds = dict(zip(read.slice.axes, read.slice.bounds, strict=True))
                assert bounds[axis] == splits[read.split].ranges[rank.tp_rank]
    held = [layer for lo, hi in result.stages for layer in range(lo, hi)]
    assert held == list(range(shape.layers))
    if shape.experts:
        owned = [e for lo, hi in result.expert_blocks for e in range(lo, hi)]
        assert owned == list(range(shape.experts))
        assert all(
            expert_owner(e, shape.experts, topology.ep) == r
            for r, (lo, hi) in enumerate(result.expert_blocks)
            for e in range(lo, hi)
        )
    assert result.rank(topology.world_size * topology.dp - 1) == result.ranks[-1]
    assert plan(inv, topology, max_gap=max_gap).digest() == result.digest()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(case=cases(), data=st.data())
def test_a_partial_plan_holds_exactly_the_full_plans_ranks_and_the_same_decisions(
    case: tuple[Shape, str, int, Topology, int, int, int], data: st.DataObject
) -> None:
    _, _, _, topology, _, _, max_gap = case
    inv, full = _planned(case)
    wanted = data.draw(st.sets(st.integers(0, topology.world_size - 1), min_size=1))
    part = plan(inv, topology, max_gap=max_gap, ranks=wanted)
    assert [r.rank for r in part.ranks] == sorted(wanted)
    assert all(part.rank(r) == full.rank(r) for r in wanted)
    assert part.partial == (len(wanted) < topology.world_size) and not full.partial
    assert part.decisions_digest() == full.decisions_digest()
    assert part.totals.bytes_assigned == sum(full.rank(r).bytes_assigned for r in wanted)
    missing = set(range(topology.world_size)) - wanted
    if missing:
        with pytest.raises(TopologyError, match=f"rank {min(missing)} is not in this plan"):
            part.rank(min(missing))
    with pytest.raises(TopologyError, match=rf"rank {topology.world_size}: expected 0\.\."):
        plan(inv, topology, ranks=[topology.world_size])
