"""The collectives the graph calls, as two small protocols, and their single-process implementation.

A :class:`Group` is the set of ranks a sum or a concatenation runs over (a tensor-parallel group, or
the tp x ep ranks of one pipeline stage for mixture-of-experts outputs); a :class:`Pipe` moves hidden
states between pipeline stages and shares the last stage's logits with every rank. Four methods in
all: the graph needs nothing else, and a torch.distributed, a simulated or a single-process world each
fit in a few lines (:mod:`.dist`, :class:`LocalGroup`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import GraphLayoutError


class Group(Protocol):
    """Ranks that reduce or gather together; ``rank`` is this process's index in the group."""

    @property
    def rank(self) -> int:
        """The index of this process in the group."""
        ...

    @property
    def size(self) -> int:
        """Ranks in the group."""
        ...

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of ``x`` over the group (every rank gets it)."""
        ...

    def all_gather(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dim; member ``i`` holds ``sizes[i]`` columns."""
        ...


class Pipe(Protocol):
    """Point-to-point links between pipeline stages, and the logits' way back to every rank."""

    def send_next(self, x: torch.Tensor) -> None:
        """Send hidden states to this rank's peer in the next stage."""
        ...

    def recv_prev(self, like: torch.Tensor) -> torch.Tensor:
        """Receive hidden states shaped and typed like ``like`` from the previous stage."""
        ...

    def share_last(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's ``x`` on every rank (other stages pass a buffer of the same shape)."""
        ...


@dataclass(frozen=True, slots=True)
class LocalGroup:
    """A group of one: sums and concatenations are the identity."""

    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself."""
        return x

    def all_gather(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """``x`` itself, after checking it holds ``sizes[0]`` columns."""
        if len(sizes) != 1 or x.shape[-1] != sizes[0]:
            raise GraphLayoutError(
                f"all_gather in a group of one: sizes {list(sizes)}, tensor {list(x.shape)}"
            )
        return x


@dataclass(frozen=True, slots=True)
class Mesh:
    """The groups one rank computes with: its tp group, its stage's tp x ep ranks, and the pipe."""

    tp: Group
    stage: Group
    pipe: Pipe | None = None
    first: bool = True
    last: bool = True

    @classmethod
    def local(cls) -> Mesh:
        """One process holding the whole model."""
        return cls(tp=LocalGroup(), stage=LocalGroup())
