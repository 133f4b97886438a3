"""Plan who reads which bytes: :func:`plan` turns an inventory and a topology into a :class:`.Plan`.

Steps: check the inventory (every plane present, byte ranges exact) and the topology against the model
(pp <= layers, ep <= experts); give each weight its slot rule (:mod:`.rules`) and plane layouts
(:mod:`.layout`); split each shared dim once, honouring every member's alignment units
(:mod:`.splits`); then, per rank, take the weights its stage and ep rank need, cut their logical slice,
map it onto every plane, and total the bytes. Pure: no I/O.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.contracts.model import LogicalWeight
from shardport.registry.families.llama import CONFIG_KEYS as _KEYS

from .coalesce import measure_runs
from .errors import InventoryError, TopologyError
from .inventory import ModelDims, Source, inventory_of, resolve_dims, tensors_by_name
from .layout import Constraint, PlaneLayout, plane_layout
from .plan import LogicalSlice, Plan, PlanTotals, Policy, Range, RankPlan, Run, SplitRecord, TensorRead
from .rules import SlotRule, slot_rule, stage_uses
from .splits import Dim, split_attention, split_dim
from .topology import RankCoords, Topology, expert_owner, experts_of, layers_of


@dataclass(frozen=True, slots=True)
class _Placed:
    """A weight with its rule, plane layouts and the stages (with uses) that need it."""

    weight: LogicalWeight
    rule: SlotRule
    layouts: tuple[PlaneLayout, ...]
    uses: Mapping[int, tuple[str, ...]]


def _check_topology(topology: Topology, dims: ModelDims) -> None:
    if topology.pp > max(dims.num_layers, 1):
        raise TopologyError(
            f"pp={topology.pp} > {dims.num_layers} layers: some stage would hold no layer; "
            f"use pp <= {max(dims.num_layers, 1)}"
        )
    if topology.ep > 1 and topology.ep > dims.num_experts:
        raise TopologyError(
            f"ep={topology.ep} > {dims.num_experts} experts: some ep rank would own no expert; "
            f"use ep <= {max(dims.num_experts, 1)}"
        )


def _extent(weight: LogicalWeight, axis: str) -> int:
    extents: dict[str, int] = dict(zip(weight.shape.axes, weight.shape.extents, strict=True))
    return extents[axis]


def _dim(key: str, members: list[_Placed]) -> Dim:
    """Gather a shared dim: its members must agree on its extent; their constraints, deduplicated."""
    extents = {m.weight.name: _extent(m.weight, m.rule.axis or "N") for m in members}
    if len(set(extents.values())) > 1:
        raise InventoryError(
            f"{key}: weights sharing this dim disagree on its extent: {extents}; the split points "
            "of paired operators must agree"
        )
    found: dict[tuple[int, str], Constraint] = {}
    for m in members:
        for layout in m.layouts:
            for c in layout.constraints(m.rule.axis or "N"):
                found.setdefault((c.unit, c.why), c)
    names = tuple(m.weight.name for m in members)
    return Dim(key, members[0].rule.axis or "N", extents[names[0]], tuple(found.values()), names)


def _attention(
    name: str, q: Dim | None, kv: Dim | None, dims: ModelDims, tp: int, policy: Policy
) -> list[SplitRecord]:
    """Split a layer's attention dims, after checking them against the head counts."""
    heads, head_dim = dims.num_heads, dims.head_dim
    if heads is None or head_dim is None:
        raise InventoryError(
            f"{name}: splitting attention needs {_KEYS['heads']} and head_dim (or {_KEYS['hidden']}) in "
            f"the model parameters, to cut at head boundaries under tp={tp}"
        )
    kv_heads = dims.num_kv_heads or heads
    for dim, count, what in ((q, heads, _KEYS["heads"]), (kv, kv_heads, _KEYS["kv_heads"])):
        if dim is not None and dim.extent != count * head_dim:
            raise InventoryError(
                f"{dim.where} != {what} {count} * head_dim {head_dim} = {count * head_dim}; "
                "fix the model parameters"
            )
    return split_attention(q, kv, heads, kv_heads, head_dim, tp, policy)


def _decide(
    placed: list[_Placed], topology: Topology, dims: ModelDims, policy: Policy
) -> dict[str, SplitRecord]:
    """Split every shared dim once (a layer's query and kv heads together)."""
    groups: dict[str, list[_Placed]] = {}
    for item in placed:
        if item.rule.dim is not None:
            groups.setdefault(item.rule.dim, []).append(item)
    shared = {key: _dim(key, members) for key, members in groups.items()}
    out: dict[str, SplitRecord] = {}
    for key in sorted(shared):
        if key in out:
            continue
        if key.endswith((".heads", ".kv")):
            base = key.rpartition(".")[0]
            q, kv = shared.get(base + ".heads"), shared.get(base + ".kv")
            records = _attention(shared[key].members[0], q, kv, dims, topology.tp, policy)
        else:
            records = [split_dim(shared[key], topology.tp, policy)]
        out.update((record.key, record) for record in records)
    return out


def _bounds(
    item: _Placed, at: RankCoords, topology: Topology, dims: ModelDims, splits: Mapping[str, SplitRecord]
) -> dict[str, Range]:
    """The logical slice of ``item`` that rank ``at`` owns."""
    shape = item.weight.shape
    bounds: dict[str, Range] = {a: (0, e) for a, e in zip(shape.axes, shape.extents, strict=True)}
    if "E" in bounds:
        owned = experts_of(at.ep_rank, dims.num_experts, topology.ep)
        bounds["E"] = (owned.start, owned.stop)
    split = splits.get(item.rule.dim) if item.rule.dim is not None else None
    if split is not None and item.rule.axis is not None:
        bounds[item.rule.axis] = split.ranges[at.tp_rank]
    return bounds


def _needs(item: _Placed, at: RankCoords, topology: Topology, dims: ModelDims) -> bool:
    if at.pp_stage not in item.uses:
        return False
    expert = item.weight.binding.expert
    return expert is None or expert_owner(expert, dims.num_experts, topology.ep) == at.ep_rank


def _orphan_read(entry: TensorEntry) -> TensorRead:
    """A tensor no weight binds: read whole by every rank."""
    size = entry.end - entry.start
    return TensorRead(
        tensor=entry.name,
        file=entry.file,
        weight=None,
        role=entry.role or "float",
        rule="replicate",
        split=None,
        uses=(),
        slice=LogicalSlice(
            axes=tuple(f"d{i}" for i in range(len(entry.shape))), bounds=tuple((0, d) for d in entry.shape)
        ),
        index=tuple((0, d) for d in entry.shape),
        shape=tuple(entry.shape),
        runs=((entry.start, size, size, 1),) if size else (),
        nbytes=size,
    )


class _Planner:
    """One planning run: the placed weights, the split decisions, and a cache of plane runs."""

    def __init__(self, source: Source, topology: Topology, policy: Policy) -> None:
        inventory = inventory_of(source)
        self.topology = topology
        self.tensors = tensors_by_name(inventory)
        self.dims = resolve_dims(inventory.weights, inventory.params)
        _check_topology(topology, self.dims)
        self.placed = [
            _Placed(
                weight=w,
                rule=slot_rule(w.name, w.binding, w.shape.axes, topology.tp),
                layouts=tuple(plane_layout(w, p, self.tensors[p.tensor]) for p in w.planes),
                uses=stage_uses(w.binding, self.dims.num_layers, topology.pp),
            )
            for w in inventory.weights
        ]
        self.splits = _decide(self.placed, topology, self.dims, policy) if topology.tp > 1 else {}
        bound = {p.tensor for w in inventory.weights for p in w.planes}
        self.orphans = [e for name, e in sorted(self.tensors.items()) if name not in bound]
        # per stage, the weights it uses, in inventory order (a rank looks only at its stage's)
        self.staged: dict[int, list[_Placed]] = {}
        for item in self.placed:
            for stage in item.uses:
                self.staged.setdefault(stage, []).append(item)
        self._runs: dict[tuple[str, tuple[Range, ...]], tuple[tuple[Run, ...], int]] = {}

    def reads(self, at: RankCoords) -> list[TensorRead]:
        """Every tensor rank ``at`` reads, in inventory order."""
        out: list[TensorRead] = []
        for item in self.staged.get(at.pp_stage, ()):
            if not _needs(item, at, self.topology, self.dims):
                continue
            bounds = _bounds(item, at, self.topology, self.dims, self.splits)
            # built from checked parts (tuples of ints, literal rules): constructed, not re-validated
            logical = LogicalSlice.model_construct(
                axes=item.weight.shape.axes, bounds=tuple(bounds[a] for a in item.weight.shape.axes)
            )
            for layout in item.layouts:
                index = layout.index(bounds)
                key = (layout.tensor, index)
                if key not in self._runs:
                    found = layout.runs(index)
                    self._runs[key] = found, sum(n * c for _, n, _, c in found)
                runs, nbytes = self._runs[key]
                entry_index = layout.entry_index(index)
                out.append(
                    TensorRead.model_construct(
                        tensor=layout.tensor,
                        file=layout.file,
                        weight=item.weight.name,
                        role=layout.role,
                        rule=item.rule.rule,
                        split=item.rule.dim if item.rule.dim in self.splits else None,
                        uses=item.uses[at.pp_stage],
                        slice=logical,
                        index=entry_index,
                        shape=tuple(b - a for a, b in entry_index),
                        runs=runs,
                        nbytes=nbytes,
                    )
                )
        out.extend(_orphan_read(entry) for entry in self.orphans)
        return out


def _rank_plan(at: RankCoords, reads: list[TensorRead], planner: _Planner, max_gap: int) -> RankPlan:
    runs = [(r.file, *run) for r in reads for run in r.runs]
    union, fetched, requests = measure_runs(runs, max_gap)
    dims, topology = planner.dims, planner.topology
    layers = layers_of(at.pp_stage, dims.num_layers, topology.pp) if dims.num_layers else range(0)
    experts = experts_of(at.ep_rank, dims.num_experts, topology.ep) if dims.num_experts else range(0)
    return RankPlan(
        rank=at.rank,
        pp_stage=at.pp_stage,
        ep_rank=at.ep_rank,
        tp_rank=at.tp_rank,
        layers=(layers.start, layers.stop),
        experts=(experts.start, experts.stop),
        reads=tuple(reads),
        bytes_assigned=union,
        bytes_fetched=fetched,
        requests=requests,
        read_amplification=fetched / union if union else 1.0,
    )


def plan(
    source: Source,
    topology: Topology,
    *,
    policy: Policy = "align",
    max_gap: int = 0,
    ranks: Iterable[int] | None = None,
) -> Plan:
    """Plan the reads of every rank of ``topology``, or of ``ranks`` only.

    ``source``: a :class:`~shardport.registry.artifact.manifest.Manifest`, an :class:`.Inventory`, or a
    ``(weights, tensors, params)`` tuple. ``policy``: ``align`` moves split points that would cut a
    group, block, packed word or head to its boundaries (recorded in ``Plan.splits``); ``refuse`` raises
    :class:`.SplitRefusedError` instead. ``max_gap``: the coalescing gap (bytes) under which the read
    amplification is reported. ``ranks``: ranks of one replica to plan (a partial plan, totals over
    them); the split decisions are made for the whole topology either way, so each planned rank's reads
    equal those of the full plan.
    """
    if policy not in ("align", "refuse"):
        raise TopologyError(f"placement policy {policy!r}: expected 'align' or 'refuse'")
    with paused_gc():
        return _plan(source, topology, policy, max_gap, ranks)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (process-wide) while many small acyclic records are built.

    Used by the planner and the loader's read scheduler. A 405B llama's plan at 512 ranks builds ~40k
    reads; in a driver holding a manifest and another plan, the collections they triggered (each walking
    every live object) took 1.5-3.5x the planning itself.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan(
    source: Source, topology: Topology, policy: Policy, max_gap: int, ranks: Iterable[int] | None
) -> Plan:
    planner = _Planner(source, topology, policy)  # the topology and splits checked before any rank loop
    wanted = range(topology.world_size) if ranks is None else sorted(set(ranks))
    if ranks is not None:
        for rank in wanted:
            if not 0 <= rank < topology.world_size:
                raise TopologyError(f"rank {rank}: expected 0..{topology.world_size - 1} for {topology}")
    if not wanted:
        raise TopologyError("no rank to plan: expected at least one")
    planned = tuple(
        _rank_plan(at, planner.reads(at), planner, max_gap) for at in map(topology.coords, wanted)
    )
    checkpoint = sum(e.end - e.start for e in planner.tensors.values())
    assigned = sum(r.bytes_assigned for r in planned)
    dims = planner.dims
    stages = [
        layers_of(s, dims.num_layers, topology.pp) if dims.num_layers else range(0)
        for s in range(topology.pp)
    ]
    blocks = [
        experts_of(e, dims.num_experts, topology.ep) if dims.num_experts else range(0)
        for e in range(topology.ep)
    ]
    return Plan(
        topology=topology,
        policy=policy,
        max_gap=max_gap,
        dims=dims,
        stages=tuple((s.start, s.stop) for s in stages),
        expert_blocks=tuple((b.start, b.stop) for b in blocks),
        splits=tuple(planner.splits.values()),
        ranks=planned,
        totals=PlanTotals(
            checkpoint_bytes=checkpoint,
            bytes_assigned=assigned,
            bytes_fetched=sum(r.bytes_fetched for r in planned),
            requests=sum(r.requests for r in planned),
            replication=assigned / checkpoint if checkpoint else 1.0,
            max_read_amplification=max(r.read_amplification for r in planned),
        ),
        partial=len(planned) != topology.world_size,
    )
