"""Which node each rank runs on: tensor-parallel groups inside a node, pipeline stages across nodes.

Pure: the cluster is described by :class:`NodeView` values (what Ray reports of each alive node: its id,
address, CPUs and GPUs); :func:`place_on_nodes` returns a frozen :class:`NodePlacement` or refuses with
the arithmetic (:class:`NodeCapacityError`). The placement follows what vLLM and torchtitan do:

- The unit of placement is one tensor-parallel group (``tp`` consecutive ranks: tp is the fastest axis of
  the rank numbering, :mod:`.topology`). A group is never split over two nodes: its all-reduces run at
  every layer, and only a node's own links are fast enough for them.
- Units are laid onto the nodes in rank order, each node filled before the next (the driver's node
  first, then the others in the order given): the expert-parallel groups of one pipeline stage stay
  together where they fit, and pipeline stages (whose traffic is one activation per micro-batch) cross
  nodes.
- A rank needs one GPU where the bring-up computes on GPUs, else a share of a CPU (``cpu_share``): a
  node holds ``floor(GPUs)`` or ``floor(CPUs / cpu_share)`` ranks.
- Where no node holds a whole tensor-parallel group but the nodes together hold every rank, the groups
  span nodes (each node filled with as many consecutive ranks as it holds), and the placement says so
  (:attr:`NodePlacement.tp_spans_nodes`; the evidence records it): it runs, with every layer's
  all-reduces crossing the network.

Every rank on one node reads the node's union of bytes once (the loader's ``load_ranks``): the
placement's :meth:`NodePlacement.groups` are those unions' rank sets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import TopologyError
from .topology import Topology

_EPS = 1e-9


class NodeCapacityError(TopologyError):
    """The cluster's nodes cannot hold the topology (the message shows the arithmetic)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One alive node as the cluster reports it."""

    node_id: str
    address: str
    cpus: float
    gpus: float = 0.0

    def capacity(self, use_gpus: bool, cpu_share: float) -> int:
        """How many ranks this node holds: one per whole GPU, or one per ``cpu_share`` of its CPUs."""
        if use_gpus:
            return math.floor(self.gpus + _EPS)
        if cpu_share <= 0:
            raise ValueError(f"cpu_share {cpu_share}: expected > 0")
        return math.floor(self.cpus / cpu_share + _EPS)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The ranks one node runs (consecutive whole tensor-parallel groups)."""

    node_id: str
    address: str
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NodePlacement:
    """Where every rank of one replica runs: one :class:`NodeGroup` per node used, in rank order."""

    topology: Topology
    use_gpus: bool
    cpu_share: float
    groups: tuple[NodeGroup, ...]
    tp_spans_nodes: bool = False
    """Whether a tensor-parallel group spans nodes (no node holds one whole)."""

    def node_of(self, rank: int) -> NodeGroup:
        """The group (node) that runs ``rank``."""
        for group in self.groups:
            if rank in group.ranks:
                return group
        raise ValueError(f"rank {rank}: not placed (world size {self.topology.world_size})")

    @property
    def nodes(self) -> tuple[str, ...]:
        """Each rank's node id, in rank order."""
        return tuple(self.node_of(r).node_id for r in range(self.topology.world_size))

    def ranks_on(self, node_id: str) -> tuple[int, ...]:
        """The ranks placed on ``node_id`` (empty when none)."""
        return tuple(r for g in self.groups if g.node_id == node_id for r in g.ranks)

    def to_json(self) -> list[dict[str, object]]:
        """The evidence's form: node id, address and ranks of each node used."""
        return [{"node": g.node_id, "address": g.address, "ranks": list(g.ranks)} for g in self.groups]


def _describe(nodes: Sequence[NodeView], use_gpus: bool, cpu_share: float) -> str:
    resource = "GPU(s)" if use_gpus else "CPU(s)"
    per_rank = "" if use_gpus else f", {cpu_share:g} CPU per rank"
    parts = [
        f"{n.address or n.node_id[:8]}: {n.gpus if use_gpus else n.cpus:g} {resource} -> "
        f"{n.capacity(use_gpus, cpu_share)} rank(s)"
        for n in nodes
    ]
    return f"{len(nodes)} node(s) ({resource}{per_rank}): " + "; ".join(parts)


def place_on_nodes(
    topology: Topology,
    nodes: Sequence[NodeView],
    *,
    use_gpus: bool,
    cpu_share: float,
    first: str | None = None,
) -> NodePlacement:
    """Place ``topology``'s ranks on ``nodes`` (``first``: the driver's node id, filled first).

    Refused (:class:`NodeCapacityError`) when the nodes together cannot hold every rank, or, where some
    node holds a whole tensor-parallel group, every group kept whole; the message gives each node's
    capacity and what was needed. Where no node holds a whole group, groups span nodes (recorded).
    """
    if not nodes:
        raise NodeCapacityError("the cluster reports no alive node")
    ordered = sorted(nodes, key=lambda n: (n.node_id != first,))  # stable: the driver's node first
    tp, world = topology.tp, topology.world_size
    ranks = [n.capacity(use_gpus, cpu_share) for n in ordered]
    described = _describe(ordered, use_gpus, cpu_share)
    whole = [cap // tp for cap in ranks]
    spans = max(whole) < 1
    if sum(ranks) < world:
        raise NodeCapacityError(
            f"{topology.tp}x{topology.ep}x{topology.pp} = {world} ranks; the nodes hold {sum(ranks)} "
            f"rank(s) in all ({described}); lower the topology or add nodes"
        )
    if not spans and sum(whole) * tp < world:
        raise NodeCapacityError(
            f"{world} ranks in {world // tp} tensor-parallel group(s) of {tp}, each kept on one node; the "
            f"nodes hold {sum(whole)} such group(s) in all ({described}); lower the topology or add nodes"
        )
    unit = 1 if spans else tp
    groups: list[NodeGroup] = []
    at = 0
    for node, cap in zip(ordered, ranks, strict=True):
        take = min(cap // unit * unit, world - at)
        if take <= 0:
            continue
        groups.append(NodeGroup(node.node_id, node.address, tuple(range(at, at + take))))
        at += take
        if at == world:
            break
    return NodePlacement(
        topology=topology, use_gpus=use_gpus, cpu_share=cpu_share, groups=tuple(groups), tp_spans_nodes=spans
    )
