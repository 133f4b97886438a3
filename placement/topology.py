"""Topology (tp * ep * pp, with dp replicas), rank numbering, and the layer and expert assignments.

Vocabulary: an *axis* of the mesh is tp, ep, pp or dp; a *dim* is a tensor dimension.

Rank numbering (tp fastest, then ep, then pp)::

    rank = (pp_stage * ep + ep_rank) * tp + tp_rank          0 <= rank < world_size = tp * ep * pp

Data-parallel replicas repeat the same plan: global rank ``g`` is replica ``g // world_size`` playing
rank ``g % world_size``. The tp ranks of one (pp_stage, ep_rank) pair form a tensor-parallel group.

Two functions are the single source of truth for who holds what along ep and pp:
:func:`expert_owner` (expert → ep rank, contiguous balanced blocks) and :func:`stage_of_layer`
(layer → pp stage, contiguous balanced blocks). :func:`experts_of` and :func:`layers_of` are derived
from them, never computed separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import TopologyError


def _check_degree(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"topology: {name}={value!r} must be a positive integer; use 1 to disable {name}")


@dataclass(frozen=True, slots=True)
class RankCoords:
    """Where a rank sits in the mesh."""

    rank: int
    pp_stage: int
    ep_rank: int
    tp_rank: int


@dataclass(frozen=True, slots=True)
class Topology:
    """A parallel layout: tensor (tp), expert (ep) and pipeline (pp) degrees, and dp replicas."""

    tp: int
    ep: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "pp", "dp"):
            _check_degree(name, getattr(self, name))

    @property
    def world_size(self) -> int:
        """Ranks in one replica: ``tp * ep * pp``."""
        return self.tp * self.ep * self.pp

    def rank_of(self, pp_stage: int, ep_rank: int, tp_rank: int) -> int:
        """The rank number of mesh coordinates (see the module docstring)."""
        for name, value, limit in (("pp_stage", pp_stage, self.pp), ("ep_rank", ep_rank, self.ep)):
            if not 0 <= value < limit:
                raise TopologyError(f"topology: {name}={value} is outside 0..{limit - 1}")
        if not 0 <= tp_rank < self.tp:
            raise TopologyError(f"topology: tp_rank={tp_rank} is outside 0..{self.tp - 1}")
        return (pp_stage * self.ep + ep_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> RankCoords:
        """Mesh coordinates of a rank in ``0..world_size-1``."""
        if not 0 <= rank < self.world_size:
            raise TopologyError(
                f"topology: rank {rank} is outside 0..{self.world_size - 1} "
                f"(world size tp*ep*pp = {self.tp}*{self.ep}*{self.pp} = {self.world_size})"
            )
        tp_rank = rank % self.tp
        ep_rank = (rank // self.tp) % self.ep
        pp_stage = rank // (self.tp * self.ep)
        return RankCoords(rank=rank, pp_stage=pp_stage, ep_rank=ep_rank, tp_rank=tp_rank)

    def replica_of(self, global_rank: int) -> tuple[int, int]:
        """``(replica, rank)`` of a global rank in ``0..world_size*dp-1``."""
        total = self.world_size * self.dp
        if not 0 <= global_rank < total:
            raise TopologyError(
                f"topology: global rank {global_rank} is outside 0..{total - 1} "
                f"(world size {self.world_size} * dp {self.dp})"
            )
        return divmod(global_rank, self.world_size)


def expert_owner(expert: int, num_experts: int, ep: int) -> int:
    """The ep rank that owns ``expert``: contiguous blocks, the first ones one larger when uneven.

    ``owner = expert * ep // num_experts``; with 8 experts over ep=3 the blocks are 3, 3, 2.
    """
    if not 0 <= expert < num_experts:
        raise TopologyError(f"expert {expert} is outside 0..{num_experts - 1}")
    if ep > num_experts:
        raise TopologyError(
            f"ep={ep} > {num_experts} experts: some ep rank would own no expert; use ep <= {num_experts}"
        )
    return expert * ep // num_experts


def experts_of(ep_rank: int, num_experts: int, ep: int) -> range:
    """The experts :func:`expert_owner` gives to ``ep_rank`` (always a contiguous range)."""
    owned = [e for e in range(num_experts) if expert_owner(e, num_experts, ep) == ep_rank]
    return range(owned[0], owned[-1] + 1) if owned else range(0)


def stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    """The pp stage that holds ``layer``: contiguous blocks, ``layer * pp // num_layers``."""
    if not 0 <= layer < num_layers:
        raise TopologyError(f"layer {layer} is outside 0..{num_layers - 1}")
    if pp > num_layers:
        raise TopologyError(
            f"pp={pp} > {num_layers} layers: some stage would hold no layer; use pp <= {num_layers}"
        )
    return layer * pp // num_layers


def layers_of(stage: int, num_layers: int, pp: int) -> range:
    """The layers :func:`stage_of_layer` gives to ``stage`` (always a contiguous range)."""
    held = [layer for layer in range(num_layers) if stage_of_layer(layer, num_layers, pp) == stage]
    return range(held[0], held[-1] + 1) if held else range(0)
