"""The per-node ledger drawn from rank reports: one read per node, amplification over the node's union."""

from __future__ import annotations

from typing import Any

from shardport.deploy.node_ledger import node_ledger, tp_spans_nodes


def _report(
    rank: int, node: str, pp: int, read: dict[str, Any] | None, assigned: int, fetched: int
) -> dict[str, Any]:
    return {
        "rank": rank,
        "node": {"id": node, "address": f"10.0.0.{node[-1]}"},
        "coords": {"tp": rank % 2, "ep": 0, "pp": pp},
        "node_read": read,
        "ledger": {"bytes_assigned": assigned, "bytes_fetched": fetched},
    }


def test_a_node_that_read_once_counts_that_read_and_a_lone_rank_its_own() -> None:
    shared = {
        "ranks": [0, 1],
        "leader": 0,
        "bytes_assigned": 300,
        "bytes_fetched": 330,
        "requests": 4,
        "seconds": 0.1,
    }
    reports = [
        _report(1, "n1", 0, shared, 100, 0),
        _report(0, "n1", 0, shared, 200, 330),
        _report(2, "n2", 1, None, 150, 150),
    ]
    first, second = node_ledger(reports)
    assert first["node"] == "n1" and first["ranks"] == [0, 1] and first["reads"] == 1
    assert first["bytes_fetched"] == 330 and first["bytes_assigned"] == 300
    assert abs(first["read_amplification"] - 1.1) < 1e-12
    assert second["ranks"] == [2] and second["reads"] == 1 and second["read_amplification"] == 1.0
    assert not tp_spans_nodes(reports)
    moved = [*reports[:1], _report(0, "n3", 0, None, 200, 200)]
    assert tp_spans_nodes(moved)  # ranks 0 and 1 (one tp group) on two nodes


def test_ranks_run_in_process_count_on_one_local_node() -> None:
    [only] = node_ledger([{"rank": 0, "ledger": {"bytes_assigned": 5, "bytes_fetched": 5}}])
    assert only["node"] == "local" and only["ranks"] == [0] and only["read_amplification"] == 1.0
