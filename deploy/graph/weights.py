"""What one rank runs: its operators (pluggable linears), its slice of the heads and the vocabulary.

A linear operator is any callable ``linear(x: [T, K_local]) -> [T, N_local]``: a prepared packed
kernel on a bring-up, :func:`float_linear` over a float weight in tests and the reference. The graph
never sees how a weight is stored. Norms and biases are small float tensors, replicated (biases of
column-parallel operators hold the rank's columns). An embedding is a :data:`Lookup` from local row
ids to rows, so a quantized embedding can decode only the rows it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from shardport.registry.contracts.graph import GraphContract

from ..errors import GraphLayoutError

Linear = Callable[[torch.Tensor], torch.Tensor]
"""``x [T, K_local] -> [T, N_local]`` (the operator's ``x @ W_local.T``)."""
Lookup = Callable[[torch.Tensor], torch.Tensor]
"""``local row ids [T] -> rows [T, hidden]`` of the rank's slice of an embedding."""
Range = tuple[int, int]


def float_linear(weight: torch.Tensor, device: torch.device | None = None) -> Linear:
    """The linear operator of a float weight ``[N, K]`` (float32 matmul): tests and the reference.

    ``device``: where the weight is held and the matmul runs (default: where ``weight`` is).
    """
    w = weight.to(device=device or weight.device, dtype=torch.float32).contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32) @ w.T

    return linear


def float_lookup(table: torch.Tensor, device: torch.device | None = None) -> Lookup:
    """Row lookup in a float embedding slice ``[rows, hidden]`` (held on ``device``, default ``table``'s)."""
    t = table.to(device=device or table.device, dtype=torch.float32).contiguous()

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        return t[ids]

    return lookup


@dataclass(frozen=True, slots=True)
class Attention:
    """A layer's attention operators (column-parallel q, k, v; row-parallel o) and optional q/k/v bias."""

    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class Mlp:
    """A SwiGLU MLP: ``down(silu(gate(x)) * up(x))`` (gate/up column-parallel, down row-parallel)."""

    gate: Linear
    up: Linear
    down: Linear


@dataclass(frozen=True, slots=True)
class Experts:
    """A mixture of experts: a replicated router ``[T, hidden] -> [T, experts]`` and the owned experts."""

    router: Linear
    owned: Mapping[int, Mlp]


@dataclass(frozen=True, slots=True)
class Layer:
    """One decoder layer as a rank holds it."""

    index: int
    input_norm: torch.Tensor
    attention: Attention
    post_norm: torch.Tensor
    mlp: Mlp | Experts


@dataclass(frozen=True, slots=True)
class RankWeights:
    """A rank's operators: its stage's layers, the embedding on the first stage, norm and head on the last.

    ``head`` is the output projection of the rank's vocabulary rows; with tied embeddings it is the
    embedding's weight used as a linear (the caller passes the same weight's operator).
    """

    layers: tuple[Layer, ...]
    embed: Lookup | None = None
    norm: torch.Tensor | None = None
    head: Linear | None = None


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
