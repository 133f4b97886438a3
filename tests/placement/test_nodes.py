"""Node placement: tensor-parallel groups inside a node, stages across, refusals with the arithmetic."""

from __future__ import annotations

import pytest

from shardport.placement import Topology
from shardport.placement.nodes import NodeCapacityError, NodeView, place_on_nodes


def _nodes(*cpus: float, gpus: float = 0.0) -> list[NodeView]:
    return [NodeView(f"node{i}", f"10.0.0.{i + 1}", c, gpus) for i, c in enumerate(cpus)]


def test_tp_groups_stay_inside_a_node_and_stages_cross_nodes() -> None:
    placed = place_on_nodes(Topology(tp=2, pp=2), _nodes(2, 2), use_gpus=False, cpu_share=1.0)
    assert [g.ranks for g in placed.groups] == [(0, 1), (2, 3)]
    assert placed.nodes == ("node0", "node0", "node1", "node1")
    assert placed.ranks_on("node1") == (2, 3) and placed.ranks_on("node9") == ()
    assert placed.to_json()[1] == {"node": "node1", "address": "10.0.0.2", "ranks": [2, 3]}
    # every tp group is on one node, whatever the degrees
    for tp, ep, pp in ((2, 1, 4), (4, 2, 1), (1, 1, 8), (2, 2, 2)):
        topo = Topology(tp=tp, ep=ep, pp=pp)
        placed = place_on_nodes(topo, _nodes(4, 4, 4, 4), use_gpus=False, cpu_share=1.0)
        for rank in range(topo.world_size):
            base = rank - topo.coords(rank).tp_rank
            assert placed.node_of(rank) == placed.node_of(base)
        assert sorted(r for g in placed.groups for r in g.ranks) == list(range(topo.world_size))


def test_the_drivers_node_fills_first_and_gpus_count_whole() -> None:
    nodes = _nodes(8, 8, gpus=4)
    placed = place_on_nodes(Topology(tp=4, pp=2), nodes, use_gpus=True, cpu_share=1.0, first="node1")
    assert [g.node_id for g in placed.groups] == ["node1", "node0"]
    one = place_on_nodes(Topology(tp=2, pp=2), nodes, use_gpus=True, cpu_share=1.0)
    assert [g.ranks for g in one.groups] == [(0, 1, 2, 3)]  # fits one node: no traffic between nodes
    shares = place_on_nodes(Topology(tp=1, pp=4), _nodes(1, 1), use_gpus=False, cpu_share=0.5)
    assert [g.ranks for g in shares.groups] == [(0, 1), (2, 3)]


def test_a_cluster_that_cannot_hold_the_topology_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(
        NodeCapacityError, match=r"4 ranks; the nodes hold 2 rank\(s\) in all .*10\.0\.0\.1: 1 GPU"
    ):
        place_on_nodes(Topology(tp=4), _nodes(8, 8, gpus=1), use_gpus=True, cpu_share=1.0)
    with pytest.raises(NodeCapacityError, match=r"8 ranks; the nodes hold 4 rank\(s\)"):
        place_on_nodes(Topology(tp=2, pp=4), _nodes(2, 2), use_gpus=False, cpu_share=1.0)
    # 6 ranks fit (3 + 3), but three tp groups of 2 kept whole do not (one per node)
    with pytest.raises(
        NodeCapacityError, match=r"3 tensor-parallel group\(s\) of 2, each kept on one node; the nodes hold 2"
    ):
        place_on_nodes(Topology(tp=2, pp=3), _nodes(3, 3), use_gpus=False, cpu_share=1.0)
    with pytest.raises(NodeCapacityError, match="no alive node"):
        place_on_nodes(Topology(tp=1), [], use_gpus=False, cpu_share=1.0)
    assert NodeCapacityError("x").exit_code == 2


def test_a_tp_group_no_node_holds_whole_spans_nodes_and_says_so() -> None:
    placed = place_on_nodes(Topology(tp=4), _nodes(2, 2), use_gpus=False, cpu_share=1.0)
    assert [g.ranks for g in placed.groups] == [(0, 1), (2, 3)] and placed.tp_spans_nodes
    whole = place_on_nodes(Topology(tp=2, pp=2), _nodes(2, 2), use_gpus=False, cpu_share=1.0)
    assert not whole.tp_spans_nodes
