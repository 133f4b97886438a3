"""A tensor-parallel group of threads in one process: the graph's collectives without processes or gloo.

Each member thread posts its tensor, waits for the others at a barrier, and combines every member's
tensor in rank order (the same sum on every member, so runs are deterministic and comparable bit for
bit). :func:`run_threads` runs one callable per rank; a failing member aborts the barrier so the others
stop instead of waiting forever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


class Exchange:
    """The shared slots and barrier of one group of ``size`` threads."""

    def __init__(self, size: int, timeout: float = 60.0) -> None:
        self.size = size
        self.slots: list[torch.Tensor | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)

    def swap(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        """Every member's ``x``, in rank order."""
        self.slots[rank] = x
        self.barrier.wait()
        parts = [p for p in self.slots if p is not None]
        self.barrier.wait()  # nobody overwrites a slot before every member read it
        return parts


@dataclass(frozen=True)
class ThreadGroup:
    """A :class:`~shardport.deploy.graph.Group` over threads sharing one :class:`Exchange`."""

    rank: int
    size: int
    exchange: Exchange

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every member's ``x``, added in rank order."""
        parts = self.exchange.swap(self.rank, x)
        out = parts[0].clone()
        for p in parts[1:]:
            out = out + p.to(out.device)
        return out

    def all_gather(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Every member's columns, concatenated in rank order."""
        parts = self.exchange.swap(self.rank, x)
        found = [p.shape[-1] for p in parts]
        if found != list(sizes):
            raise ValueError(f"all_gather: sizes {list(sizes)}, members hold {found}")
        return torch.cat([p.to(x.device) for p in parts], dim=-1)


def thread_groups(size: int) -> list[ThreadGroup]:
    """The ``size`` members of one group."""
    exchange = Exchange(size)
    return [ThreadGroup(r, size, exchange) for r in range(size)]


def run_threads(bodies: Sequence[Callable[[], T]], groups: Sequence[ThreadGroup] = ()) -> list[T]:
    """Run one body per member in its own thread; their results in order (a member's error re-raised).

    ``groups``: the members' groups, whose barriers a failing member breaks.
    """
    results: list[T | None] = [None] * len(bodies)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = bodies[i]()
        except BaseException as exc:  # a failed member must release the others
            errors.append(exc)
            for g in groups:
                g.exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]
