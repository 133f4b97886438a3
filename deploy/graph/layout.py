"""Which heads and vocabulary rows each rank of a tp group holds.

Torch-free, so that the driver checks the layouts at plan time without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardport.registry.contracts.graph import GraphContract

from ..errors import GraphLayoutError

if TYPE_CHECKING:
    import torch

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class RankLayout:
    """Which heads and vocabulary rows each rank of a tp group holds (ranges of every rank).

    ``q_heads[r]`` and ``kv_heads[r]``: query and kv head ranges of tp rank ``r``; ``vocab[r]``:
    rows of the embedding and of the output head. Contiguous, covering, and every query head of a rank
    attends with a kv head the rank holds (the placement planner's splits satisfy this).
    """

    tp_rank: int
    q_heads: tuple[Range, ...]
    kv_heads: tuple[Range, ...]
    vocab: tuple[Range, ...]

    @property
    def tp(self) -> int:
        """Ranks in the tp group."""
        return len(self.q_heads)

    def check(self, contract: GraphContract) -> None:
        """Raise :class:`GraphLayoutError` unless the ranges fit ``contract``."""
        if not 0 <= self.tp_rank < self.tp or not len(self.kv_heads) == len(self.vocab) == self.tp:
            raise GraphLayoutError(
                f"rank layout: tp_rank {self.tp_rank}, {len(self.q_heads)} q-head, "
                f"{len(self.kv_heads)} kv-head "
                f"and {len(self.vocab)} vocab ranges: expected one range per tp rank and 0 <= tp_rank < tp"
            )
        _covering("query heads", self.q_heads, contract.heads)
        _covering("vocabulary rows", self.vocab, contract.vocab)
        for r, ((qa, qb), (ka, kb)) in enumerate(zip(self.q_heads, self.kv_heads, strict=True)):
            if not (qa < qb and 0 <= ka < kb <= contract.kv_heads):
                raise GraphLayoutError(
                    f"tp rank {r}: q heads {qa}..{qb - 1}, kv heads {ka}..{kb - 1}: empty or out of range"
                )
            first, last = qa // contract.group, (qb - 1) // contract.group
            if not ka <= first <= last < kb:
                raise GraphLayoutError(
                    f"tp rank {r}: query heads {qa}..{qb - 1} attend with kv heads {first}..{last} "
                    f"(group {contract.group}) but the rank holds kv heads {ka}..{kb - 1}"
                )

    def local_kv_index(self, contract: GraphContract, device: torch.device | None = None) -> torch.Tensor:
        """For each local query head, the index of its kv head among the rank's kv heads (on ``device``)."""
        (qa, qb), (ka, _) = self.q_heads[self.tp_rank], self.kv_heads[self.tp_rank]
        index = [h // contract.group - ka for h in range(qa, qb)]
        import torch

        return torch.tensor(index, dtype=torch.long, device=device or torch.device("cpu"))


def _covering(what: str, ranges: tuple[Range, ...], extent: int) -> None:
    at = 0
    for a, b in ranges:
        if a != at or b <= a:
            raise GraphLayoutError(
                f"{what}: ranges {list(ranges)} must be non-empty, contiguous and start at 0 "
                f"(expected {at}, found {a})"
            )
        at = b
    if at != extent:
        raise GraphLayoutError(f"{what}: ranges {list(ranges)} end at {at}, expected {extent}")


def single_layout(contract: GraphContract) -> RankLayout:
    """The layout of a tp group of one (the whole model on one rank)."""
    return RankLayout(0, ((0, contract.heads),), ((0, contract.kv_heads),), ((0, contract.vocab),))
