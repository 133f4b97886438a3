"""Rotary position embeddings, and the Q/K row permutation llama.cpp applies to llama GGUF files.

Hugging Face llama weights rotate element ``i`` of a head with element ``i + head_dim/2``
(``half``). llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k`` inside every head,
``gguf = hf.reshape(heads, 2, head_dim/2, K).swapaxes(1, 2).reshape(N, K)``, so that its rope, which
rotates adjacent elements ``2i, 2i+1``, computes the same thing (``interleaved``). The graph runs
either order as stored (``GraphContract.rope_pairs``); :func:`unpermute_gguf_qk` restores the Hugging
Face order (what transformers' GGUF loader does), :func:`gguf_qk_rows` gives the row index for
weights held as packed rows. The permutation stays inside a head, so a head-aligned tensor-parallel
slice of a permuted weight is the permuted slice.
"""

from __future__ import annotations

import math

import torch

from shardport.registry.contracts.graph import GraphContract, RopeScaling
from shardport.registry.families.llama import RopePairs


def inverse_frequencies(head_dim: int, base: float, scaling: RopeScaling | None) -> torch.Tensor:
    """``base ** (-2i / head_dim)`` for ``i < head_dim/2`` (float64), with ``scaling`` applied."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)
    if scaling is None:
        return inv
    if scaling.kind == "linear":
        return inv / scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    context = scaling.original_max_position
    assert low is not None and high is not None and context is not None  # RopeScaling checks llama3's
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > context / low, inv / scaling.factor, inv)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, blended, scaled)


def rotary_tables(contract: GraphContract, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``position * inv_freq``, float32 ``[T, head_dim/2]``, on the CPU."""
    inv = inverse_frequencies(contract.head_dim, contract.rope_base, contract.rope_scaling)
    angles = positions.to(device="cpu", dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs: RopePairs) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` by the tables (``[T, head_dim/2]``), pairing as ``pairs``."""
    c, s = cos[:, None, :], sin[:, None, :]
    if pairs == "half":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def gguf_qk_rows(heads: int, head_dim: int) -> torch.Tensor:
    """Row index ``p`` with ``gguf = hf[p]`` (llama.cpp's Q/K permutation of ``heads`` heads)."""
    half = head_dim // 2
    h, i, j = torch.meshgrid(torch.arange(heads), torch.arange(half), torch.arange(2), indexing="ij")
    return (h * head_dim + j * half + i).reshape(-1)


def permute_qk_for_gguf(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face Q or K rows (``[heads * head_dim, ...]``) in llama.cpp's GGUF order."""
    return weight[gguf_qk_rows(heads, weight.shape[0] // heads)]


def unpermute_gguf_qk(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """GGUF Q or K rows back in Hugging Face order (``heads``: the tensor's heads — kv heads for K)."""
    rows = gguf_qk_rows(heads, weight.shape[0] // heads)
    out = torch.empty_like(weight)
    out[rows] = weight
    return out
