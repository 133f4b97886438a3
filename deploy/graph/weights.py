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

Linear = Callable[[torch.Tensor], torch.Tensor]
"""``x [T, K_local] -> [T, N_local]`` (the operator's ``x @ W_local.T``)."""
Lookup = Callable[[torch.Tensor], torch.Tensor]
"""``local row ids [T] -> rows [T, hidden]`` of the rank's slice of an embedding."""


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
