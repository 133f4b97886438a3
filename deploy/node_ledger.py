"""The evidence's per-node ledger: which ranks ran on each node, and what the node read for them.

Ranks on one node read their union once (the node's first rank, ``load_ranks``): the node's bytes
fetched are that one read's, and its amplification is fetched / assigned over the node's ranks. A node
with one rank read alone. A rank report without a node (a rank run in-process) is counted on the
node ``"local"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def node_ledger(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per node, in the order of its first rank: node id, address, ranks, bytes, requests."""
    nodes: dict[str, dict[str, Any]] = {}
    for r in sorted(reports, key=lambda r: int(r["rank"])):
        where = r.get("node") or {}
        node_id = str(where.get("id", "local"))
        entry = nodes.setdefault(
            node_id,
            {"node": node_id, "address": str(where.get("address", "")), "ranks": [], "reads": []},
        )
        entry["ranks"].append(int(r["rank"]))
        read = r.get("node_read")
        ledger = r.get("ledger", {})
        if read is None:  # read alone
            entry["reads"].append(
                {
                    "ranks": [int(r["rank"])],
                    "bytes_assigned": int(ledger.get("bytes_assigned", 0)),
                    "bytes_fetched": int(ledger.get("bytes_fetched", 0)),
                }
            )
        elif int(read["leader"]) == int(r["rank"]):
            entry["reads"].append(
                {k: read[k] for k in ("ranks", "bytes_assigned", "bytes_fetched", "requests", "seconds")}
            )
    out = []
    for entry in nodes.values():
        reads = entry.pop("reads")
        assigned = sum(int(x["bytes_assigned"]) for x in reads)
        fetched = sum(int(x["bytes_fetched"]) for x in reads)
        out.append(
            {
                **entry,
                "reads": len(reads),
                "bytes_assigned": assigned,
                "bytes_fetched": fetched,
                "read_amplification": fetched / assigned if assigned else 1.0,
            }
        )
    return out


def tp_spans_nodes(reports: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the ranks of some tensor-parallel group reported different nodes (from ``coords``)."""
    seen: dict[tuple[int, int], set[str]] = {}
    for r in reports:
        coords, where = r.get("coords") or {}, r.get("node") or {}
        key = (int(coords.get("pp", 0)), int(coords.get("ep", 0)))
        seen.setdefault(key, set()).add(str(where.get("id", "local")))
    return any(len(nodes) > 1 for nodes in seen.values())
