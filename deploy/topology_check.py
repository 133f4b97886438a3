"""The ``topology`` layer: the tp/ep/pp degrees an artifact can be placed at, and the driver's check of it.

:func:`placeable_degrees` (pure: manifest in, section out) runs, per axis with the others at 1, the
plan-time checks bring-up runs before any rank starts (:func:`.up.check_plan` without the prompt): the
graph contract and its inventory, the placement plan (split points on whole groups, blocks, packed
words and heads, as the tile cuts follow them), and the rank layout of every tp rank. A model the
graph cannot run is described by the placement plan alone. Push records the result (the CLI's push;
:mod:`shardport.registry.push` takes it as data), ``inspect`` shows it.

:func:`check_degrees` refuses, before Ray starts, a request for a degree the manifest's topology does
not list, naming the valid ones. The lists are per axis: a combination of listed degrees is still
checked by :func:`.up.check_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardport import ShardportError
from shardport.placement import Topology, plan
from shardport.placement.inventory import resolve_dims
from shardport.registry.artifact.manifest import Manifest, TopologyHints
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.families.llama import CONFIG_KEYS

from .contract import check_inventory, contract_of
from .errors import GraphLayoutError
from .plan_layout import layout_from_plan
from .runnable import pinned_here

TP_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
"""The tensor-parallel degrees tried (the tile cuts' sizes and the usual powers of two)."""
MAX_DEGREE = 64
"""The most pipeline stages or expert ranks tried."""


def _graph(manifest: Manifest) -> GraphContract | None:
    """The graph contract bring-up would run, or None where the graph refuses the model."""
    try:
        contract = contract_of(manifest)
        check_inventory(contract, manifest)
    except ShardportError:
        return None
    return contract


def _fits(manifest: Manifest, contract: GraphContract | None, topology: Topology) -> bool:
    """Whether bring-up's plan-time checks accept ``topology`` (one rank planned: the splits are global)."""
    try:
        planned = plan(manifest, topology, ranks=[0])
        if contract is not None:
            if topology.pp > contract.layers or (topology.ep > 1 and not contract.moe):
                return False
            for tp_rank in range(topology.tp):
                layout_from_plan(planned, contract, tp_rank)
    except ShardportError:
        return False
    return True


def _count(manifest: Manifest, contract: GraphContract | None, key: str) -> int:
    if contract is not None:
        return contract.layers if key == "layers" else (contract.experts if contract.moe else 1)
    params = manifest.model.params
    names = (CONFIG_KEYS["layers"],) if key == "layers" else (CONFIG_KEYS["experts"], "num_experts")
    for name in names:
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 1


def _backed(manifest: Manifest) -> bool:
    """Whether the layer and expert counts the planner would use are those the weights hold.

    config.json is untrusted: the planner enumerates the layers and experts its parameters name, so a
    count no weight backs (``num_hidden_layers: 10**15``) is not planned at all.
    """
    weights = manifest.weights or []
    try:
        dims = resolve_dims(weights, manifest.model.params)
    except ShardportError:
        return False
    layers = max((w.binding.layer for w in weights if w.binding.layer is not None), default=-1) + 1
    stacked = [w.shape.extents[0] for w in weights if w.shape.axes and w.shape.axes[0] == "E"]
    bound = [w.binding.expert + 1 for w in weights if w.binding.expert is not None]
    experts = max(bound + stacked, default=0)
    return dims.num_layers <= max(layers, 1) and dims.num_experts <= experts


def placeable_degrees(manifest: Manifest) -> TopologyHints | None:
    """The degrees per axis (others at 1) bring-up can place ``manifest`` at.

    None without weights, or where the model's parameters name layers or experts its weights do not hold.
    """
    if not manifest.weights or not manifest.tensors or not _backed(manifest):
        return None
    contract = _graph(manifest)
    pp_max = min(MAX_DEGREE, _count(manifest, contract, "layers"))
    ep_max = min(MAX_DEGREE, _count(manifest, contract, "experts"))
    return TopologyHints(
        tp=[tp for tp in TP_CANDIDATES if _fits(manifest, contract, Topology(tp=tp))],
        ep=_up_to(manifest, contract, ep_max, lambda ep: Topology(tp=1, ep=ep)),
        pp=_up_to(manifest, contract, pp_max, lambda pp: Topology(tp=1, pp=pp)),
    )


def _up_to(
    manifest: Manifest, contract: GraphContract | None, most: int, at: Callable[[int], Topology]
) -> list[int]:
    """The degrees 1..``most`` of an axis that cuts no weight (whole layers or experts per rank).

    The plan refuses such a degree only above the count, so when 1 and ``most`` fit, every degree between
    does (two plans instead of ``most``); otherwise each is tried.
    """
    if most > 2 and _fits(manifest, contract, at(1)) and _fits(manifest, contract, at(most)):
        return list(range(1, most + 1))
    return [d for d in range(1, most + 1) if _fits(manifest, contract, at(d))]


def _tried(axis: str, degree: int) -> bool:
    """Whether push tried ``degree`` on ``axis`` (a degree it did not try is left to the plan's checks)."""
    return degree in TP_CANDIDATES if axis == "tp" else 1 <= degree <= MAX_DEGREE


def _listed(axis: str, want: int, valid: Sequence[int]) -> str | None:
    if want in valid or not _tried(axis, want):
        return None
    return f"--{axis} {want}: the artifact can be placed at {axis} in {list(valid) or 'none'}"


def check_degrees(manifest: Manifest, tp: int, ep: int, pp: int) -> None:
    """Refuse (:class:`GraphLayoutError`, exit 5) a degree the manifest's ``topology`` does not list.

    A manifest without a topology layer (pushed before it was recorded) or whose layers another shardport
    version computed (:func:`.runnable.pinned_here`) is not checked here, nor a
    degree push did not try (tp outside :data:`TP_CANDIDATES`, ep or pp over :data:`MAX_DEGREE`): the
    world-size bounds and the plan-time checks decide those.
    """
    hints = manifest.topology
    if hints is None or not pinned_here(manifest):  # another version's planner may have said otherwise
        return
    problems = [
        p
        for p in (_listed("tp", tp, hints.tp), _listed("ep", ep, hints.ep), _listed("pp", pp, hints.pp))
        if p is not None
    ]
    if problems:
        reason = _plan_reason(manifest, Topology(tp=tp, ep=ep, pp=pp))
        raise GraphLayoutError(
            "; ".join(problems)
            + " (the manifest's topology layer, computed at push; pick a listed degree)"
            + (f": {reason}" if reason else "")
        )


def _plan_reason(manifest: Manifest, topology: Topology) -> str | None:
    """Why the placement plan refuses ``topology`` (which weight, which cut), where it does."""
    try:
        plan(manifest, topology, ranks=[0])
    except ShardportError as exc:
        return str(exc)
    return None
