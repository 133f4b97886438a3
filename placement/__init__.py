"""shardport.placement: decide which bytes every rank needs.

Consumes a manifest's tensor inventory (``tensors``: byte ranges; ``weights``: contracts and graph
bindings; ``model.params``) and a :class:`Topology` (tp * ep * pp, dp replicas). Produces a frozen,
serializable :class:`Plan`: per rank, the tensors it reads, the logical slice of each weight it owns, and
the byte pieces holding it, with totals and read amplification. Column/row/vocab-parallel rules per
llama operator slot, GQA kv heads, experts whole per ep rank, layers per pp stage; a split that would
cut a quantization group, GGUF block, packed word or head is moved to its boundaries (``align``, recorded)
or refused (``refuse``, with the arithmetic). Pure: no torch, Ray or I/O.

- :func:`plan` — the planner; :func:`coalesce` — merge byte pieces into fetch ranges;
- :func:`expert_owner` and :func:`stage_of_layer` — the one source of truth for ep and pp assignment;
- errors: :class:`PlacementError` and its subclasses (:mod:`.errors` draws the tree).
"""

from .coalesce import Coalesced, Piece, coalesce, merge_spans
from .errors import (
    InventoryError,
    PieceError,
    PlacementError,
    SplitRefusedError,
    TopologyError,
    UnsplittableError,
    UnsupportedSplitError,
)
from .inventory import Inventory, ModelDims
from .plan import LogicalSlice, Plan, PlanTotals, Policy, RankPlan, SplitRecord, TensorRead
from .planner import plan
from .topology import RankCoords, Topology, expert_owner, experts_of, layers_of, stage_of_layer

__all__ = [
    "Coalesced",
    "Inventory",
    "InventoryError",
    "LogicalSlice",
    "ModelDims",
    "Piece",
    "PieceError",
    "PlacementError",
    "Plan",
    "PlanTotals",
    "Policy",
    "RankCoords",
    "RankPlan",
    "SplitRecord",
    "SplitRefusedError",
    "TensorRead",
    "Topology",
    "TopologyError",
    "UnsplittableError",
    "UnsupportedSplitError",
    "coalesce",
    "expert_owner",
    "experts_of",
    "layers_of",
    "merge_spans",
    "plan",
    "stage_of_layer",
]
