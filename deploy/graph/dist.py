"""The collectives over torch.distributed (gloo on CPU, NCCL on GPU), and a rank's mesh.

Rank numbering is the placement plan's (``rank = (pp_stage * ep + ep_rank) * tp + tp_rank``); the
caller passes its topology object (``placement.Topology`` fits :class:`MeshShape`), so the graph does
not import placement. Every rank must call :func:`dist_mesh` (it creates the process subgroups in
the same order everywhere, as torch.distributed requires). Every buffer a collective makes lies on its
input's device (NCCL takes CUDA tensors, gloo CPU ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from .collectives import Group, LocalGroup, Mesh


class MeshShape(Protocol):
    """The tp x ep x pp degrees and the rank numbering (``placement.Topology`` is one)."""

    @property
    def tp(self) -> int:
        """Tensor-parallel degree."""
        ...

    @property
    def ep(self) -> int:
        """Expert-parallel degree."""
        ...

    @property
    def pp(self) -> int:
        """Pipeline stages."""
        ...

    def rank_of(self, pp_stage: int, ep_rank: int, tp_rank: int) -> int:
        """The rank number of mesh coordinates."""
        ...


@dataclass(frozen=True, slots=True)
class DistGroup:
    """A torch.distributed process group (``None``: the default, whole-world group)."""

    rank: int
    size: int
    group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the group (on a copy of ``x``)."""
        out = x.contiguous().clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Concatenate every member's columns; uneven members are padded to the widest, then cut."""
        width = max(sizes)
        padded = torch.zeros(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
        padded[..., : x.shape[-1]] = x
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)


@dataclass(frozen=True, slots=True)
class DistPipe:
    """Sends to the next stage's peer, receives from the previous one's, broadcasts from the last stage."""

    next_rank: int | None
    prev_rank: int | None
    last_root: int

    def send_next(self, x: torch.Tensor) -> None:
        """Send ``x`` to the next stage's peer."""
        if self.next_rank is None:
            raise RuntimeError("send_next on the last stage")
        dist.send(x.contiguous(), dst=self.next_rank)

    def recv_prev(self, like: torch.Tensor) -> torch.Tensor:
        """Receive from the previous stage's peer into a buffer like ``like``."""
        if self.prev_rank is None:
            raise RuntimeError("recv_prev on the first stage")
        out = torch.empty_like(like)
        dist.recv(out, src=self.prev_rank)
        return out

    def share_last(self, x: torch.Tensor) -> torch.Tensor:
        """Broadcast the last stage's first rank's ``x`` to every rank."""
        out = x.contiguous().clone()
        dist.broadcast(out, src=self.last_root)
        return out


def _group(members: list[int], rank: int, world: int, cache: dict[tuple[int, ...], Any]) -> Group:
    if len(members) == 1:
        return LocalGroup()
    index = members.index(rank) if rank in members else -1
    if len(members) == world:
        return DistGroup(index, len(members))
    return DistGroup(index, len(members), cache[tuple(members)])


def dist_mesh(shape: MeshShape, rank: int) -> Mesh:
    """The mesh of ``rank`` in an initialised default process group of ``tp * ep * pp`` ranks."""
    world = shape.tp * shape.ep * shape.pp
    if dist.get_world_size() != world:
        raise RuntimeError(f"process group of {dist.get_world_size()} ranks, topology needs {world}")
    tp_groups = [
        [shape.rank_of(s, e, t) for t in range(shape.tp)] for s in range(shape.pp) for e in range(shape.ep)
    ]
    stage_groups = [
        [shape.rank_of(s, e, t) for e in range(shape.ep) for t in range(shape.tp)] for s in range(shape.pp)
    ]
    cache: dict[tuple[int, ...], Any] = {}
    for members in tp_groups + stage_groups:  # same order on every rank
        if 1 < len(members) < world and tuple(members) not in cache:
            cache[tuple(members)] = dist.new_group(members)
    stage, ep_rank, tp_rank = next(
        (s, e, t)
        for s in range(shape.pp)
        for e in range(shape.ep)
        for t in range(shape.tp)
        if shape.rank_of(s, e, t) == rank
    )
    tp = _group(tp_groups[stage * shape.ep + ep_rank], rank, world, cache)
    stage_group = _group(stage_groups[stage], rank, world, cache)
    pipe = None
    if shape.pp > 1:
        pipe = DistPipe(
            next_rank=shape.rank_of(stage + 1, ep_rank, tp_rank) if stage + 1 < shape.pp else None,
            prev_rank=shape.rank_of(stage - 1, ep_rank, tp_rank) if stage > 0 else None,
            last_root=shape.rank_of(shape.pp - 1, 0, 0),
        )
    return Mesh(tp=tp, stage=stage_group, pipe=pipe, first=stage == 0, last=stage == shape.pp - 1)
