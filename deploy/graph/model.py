"""The llama-family decoder one rank runs: prefill and greedy decode with a KV cache.

Tensor parallelism (Megatron style): q/k/v, gate and up are column-parallel (a rank computes its
heads' and its intermediate columns), o and down row-parallel (a rank's partial sums, added by one
``all_reduce`` over the tp group per block); the embedding is vocab-parallel (rows outside the rank's
range contribute zeros, one ``all_reduce``) and the output head gathers every rank's logit columns.
Mixture of experts: the router is replicated, each rank runs the experts its ep rank owns on the tokens
routed to them, and one ``all_reduce`` over the stage's tp x ep ranks sums the weighted outputs.
Pipeline: a stage receives hidden states from the previous one, runs its layers and sends them on; the
last stage's logits reach every rank, so each one picks the same greedy token. Activations are float32.
Attention takes the queries in chunks (:func:`query_chunk`): its scores are at most
:data:`SCORE_BYTES` per chunk, whatever the prompt's length (not ``heads x T x T``).

Device: a rank computes on one ``torch.device`` (``device=``; the CPU by default, a CUDA device on a
CUDA rank). Every tensor the graph makes (embedding sums, masks, rotary tables, MoE sums, pipeline
buffers, the KV cache it extends) is made there, and the float tensors it is given (norms, biases) and
every operator's output must already be there: a tensor elsewhere is a :class:`GraphWeightError`
naming it, never a silent copy. Collectives run on device tensors (gloo on the CPU, NCCL on CUDA).
:meth:`RankModel.forward` hands its logits back as CPU float32 tensors for the driver and the parity
records. Rotary tables are computed on the CPU in float64 and moved (the same tables on every device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from shardport.registry.contracts.graph import GraphContract

from ..errors import GraphLayoutError, GraphWeightError
from .collectives import Mesh
from .layout import RankLayout
from .rope import apply_rotary, rotary_tables
from .weights import Attention, Experts, Layer, Mlp, RankWeights

SCORE_BYTES = 64 * 1024 * 1024
"""The most bytes of attention scores (float32 ``heads x queries x keys``) one chunk of queries makes."""


def query_chunk(heads: int, keys: int) -> int:
    """Queries per attention chunk (at least one).

    As many as keep ``heads x chunk x keys`` float32 scores within :data:`SCORE_BYTES`.
    """
    return max(1, SCORE_BYTES // (4 * max(1, heads) * max(1, keys)))


@dataclass(slots=True)
class KVCache:
    """Per layer the rotated keys and the values of every position so far (``[S, kv_local, head_dim]``)."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    length: int = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values to ``layer``'s; return all of them."""
        if layer in self.keys:
            k, v = torch.cat((self.keys[layer], k)), torch.cat((self.values[layer], v))
        self.keys[layer], self.values[layer] = k, v
        return k, v


@dataclass(frozen=True, slots=True)
class Generation:
    """A prefill and greedy decode: prompt logits ``[T, vocab]``, the tokens, and each token's logits."""

    prompt_logits: torch.Tensor
    tokens: tuple[int, ...]
    token_logits: torch.Tensor
    """``[K, vocab]``: row ``i`` are the logits token ``i`` was chosen from (row 0 = prompt's last)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dim, in float32."""
    x = x.to(torch.float32)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float32)


class RankModel:
    """One rank's part of the decoder: ``forward`` over new tokens, ``generate`` K greedy tokens.

    Every rank of the job calls the same methods with the same tokens (collectives inside).
    """

    def __init__(
        self,
        contract: GraphContract,
        layout: RankLayout,
        weights: RankWeights,
        mesh: Mesh,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        layout.check(contract)
        if layout.tp != mesh.tp.size or layout.tp_rank != mesh.tp.rank:
            raise GraphLayoutError(
                f"layout is tp rank {layout.tp_rank} of {layout.tp}, "
                f"the mesh's tp group rank {mesh.tp.rank} of {mesh.tp.size}"
            )
        head_missing = weights.norm is None or weights.head is None
        if (mesh.first and weights.embed is None) or (mesh.last and head_missing):
            raise GraphWeightError(
                "rank weights: the first stage needs the embedding, the last the final norm and output head"
            )
        if (not mesh.first or not mesh.last) and mesh.pipe is None:
            raise GraphLayoutError("a pipeline stage that is not both first and last needs a pipe")
        self.contract, self.layout, self.weights, self.mesh = contract, layout, weights, mesh
        self.device = torch.device("cpu" if device is None else device)
        for what, tensor in _held_tensors(weights):
            self._placed(what, tensor)
        self.kv_index = layout.local_kv_index(contract, self.device)
        qa, qb = layout.q_heads[layout.tp_rank]
        ka, kb = layout.kv_heads[layout.tp_rank]
        self.q_local, self.kv_local = qb - qa, kb - ka
        self.vocab_range = layout.vocab[layout.tp_rank]
        self.vocab_sizes = [b - a for a, b in layout.vocab]

    def new_cache(self) -> KVCache:
        """An empty KV cache for this rank's layers."""
        return KVCache()

    def _placed(self, what: str, x: torch.Tensor) -> torch.Tensor:
        """``x``, after checking it lies on the rank's device (a :class:`GraphWeightError` naming it)."""
        if x.device != self.device:
            raise GraphWeightError(
                f"{what}: a tensor on {x.device}, the rank computes on {self.device} "
                "(place the rank's float tensors and operators on its device)"
            )
        return x

    # -- blocks ----------------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.weights.embed is not None
        v0, v1 = self.vocab_range
        mine = (ids >= v0) & (ids < v1)
        out = torch.zeros(ids.shape[0], self.contract.hidden, dtype=torch.float32, device=self.device)
        if bool(mine.any()):
            out[mine] = self._placed("embedding", self.weights.embed(ids[mine] - v0)).to(torch.float32)
        return self.mesh.tp.all_reduce(out)

    def _project(self, op: str, linear: object, x: torch.Tensor, width: int) -> torch.Tensor:
        y = linear(x)  # type: ignore[operator]
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (x.shape[0], width):
            found = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise GraphWeightError(f"{op}: expected output [{x.shape[0]}, {width}], found {found}")
        self._placed(f"{op} output", y)
        return y.to(torch.float32)

    def _attention(
        self,
        layer: int,
        att: Attention,
        x: torch.Tensor,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        t, d = x.shape[0], self.contract.head_dim
        q = self._project(f"layer {layer} q", att.q, x, self.q_local * d)
        k = self._project(f"layer {layer} k", att.k, x, self.kv_local * d)
        v = self._project(f"layer {layer} v", att.v, x, self.kv_local * d)
        if att.q_bias is not None and att.k_bias is not None and att.v_bias is not None:
            q, k, v = q + att.q_bias, k + att.k_bias, v + att.v_bias
        pairs = self.contract.rope_pairs
        q = apply_rotary(q.view(t, self.q_local, d), cos, sin, pairs)
        k = apply_rotary(k.view(t, self.kv_local, d), cos, sin, pairs)
        keys, values = cache.extend(layer, k, v.view(t, self.kv_local, d))
        keys, values = keys[:, self.kv_index], values[:, self.kv_index]
        start = cache.length
        key_pos = torch.arange(keys.shape[0], device=self.device)[None, :]
        step = query_chunk(self.q_local, keys.shape[0])
        parts = []
        for lo in range(0, t, step):  # one chunk of queries at a time: bounded scores (SCORE_BYTES)
            hi = min(t, lo + step)
            scores = torch.einsum("thd,shd->hts", q[lo:hi], keys) / math.sqrt(d)
            query_pos = torch.arange(start + lo, start + hi, device=self.device)[:, None]
            scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            parts.append(torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), values))
        out = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(t, self.q_local * d)
        return self.mesh.tp.all_reduce(self._project(f"layer {layer} o", att.o, out, self.contract.hidden))

    def _mlp(self, name: str, mlp: Mlp, x: torch.Tensor) -> torch.Tensor:
        gate = self._placed(f"{name} gate output", mlp.gate(x)).to(torch.float32)
        up = self._placed(f"{name} up output", mlp.up(x)).to(torch.float32)
        if gate.shape != up.shape or gate.shape[0] != x.shape[0]:
            raise GraphWeightError(f"{name}: gate {list(gate.shape)} and up {list(up.shape)} outputs differ")
        return self._project(
            f"{name} down", mlp.down, torch.nn.functional.silu(gate) * up, self.contract.hidden
        )

    def _experts(self, layer: int, moe: Experts, x: torch.Tensor) -> torch.Tensor:
        logits = self._project(f"layer {layer} router", moe.router, x, self.contract.experts)
        top, chosen = torch.topk(logits, self.contract.experts_per_token, dim=-1)
        weights = torch.softmax(top, dim=-1)
        out = torch.zeros(x.shape[0], self.contract.hidden, dtype=torch.float32, device=self.device)
        for expert, mlp in sorted(moe.owned.items()):
            rows, slot = torch.nonzero(chosen == expert, as_tuple=True)
            if rows.numel():
                y = self._mlp(f"layer {layer} expert {expert}", mlp, x[rows])
                out.index_add_(0, rows, y * weights[rows, slot, None])
        return self.mesh.stage.all_reduce(out)

    def _layer(
        self, layer: Layer, h: torch.Tensor, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        eps = self.contract.norm_eps
        h = h + self._attention(
            layer.index, layer.attention, rms_norm(h, layer.input_norm, eps), cache, cos, sin
        )
        x = rms_norm(h, layer.post_norm, eps)
        if isinstance(layer.mlp, Experts):
            return h + self._experts(layer.index, layer.mlp, x)
        return h + self.mesh.tp.all_reduce(self._mlp(f"layer {layer.index}", layer.mlp, x))

    # -- steps -----------------------------------------------------------------------------------
    def forward(self, tokens: Sequence[int] | torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits ``[T, vocab]`` (CPU float32, on every rank) of ``tokens`` following the cached positions."""
        cpu, dev = torch.device("cpu"), self.device
        ids = torch.as_tensor(tokens, dtype=torch.long, device=cpu).reshape(-1)
        if ids.numel() == 0:
            raise GraphLayoutError("forward: no tokens")
        if bool(((ids < 0) | (ids >= self.contract.vocab)).any()):
            raise GraphLayoutError(f"forward: token ids must lie in 0..{self.contract.vocab - 1}")
        t, mesh = ids.shape[0], self.mesh
        positions = torch.arange(cache.length, cache.length + t, device=cpu)
        cos, sin = (x.to(dev) for x in rotary_tables(self.contract, positions))
        if mesh.first:
            h = self._embed(ids.to(dev))
        else:
            assert mesh.pipe is not None
            h = mesh.pipe.recv_prev(torch.empty(t, self.contract.hidden, dtype=torch.float32, device=dev))
        for layer in self.weights.layers:
            h = self._layer(layer, h, cache, cos, sin)
        cache.length += t
        logits = torch.empty(t, self.contract.vocab, dtype=torch.float32, device=dev)
        if not mesh.last:
            assert mesh.pipe is not None
            mesh.pipe.send_next(h)
        else:
            assert self.weights.norm is not None and self.weights.head is not None
            x = rms_norm(h, self.weights.norm, self.contract.norm_eps)
            local = self._project("output head", self.weights.head, x, self.vocab_sizes[self.layout.tp_rank])
            logits = mesh.tp.all_gather(local, self.vocab_sizes)
        if mesh.pipe is not None:
            logits = mesh.pipe.share_last(logits)
        return logits.to(cpu)

    def generate(self, prompt: Sequence[int], steps: int) -> Generation:
        """Prefill ``prompt`` and decode ``steps`` greedy tokens (argmax, lowest id on ties)."""
        if steps < 1:
            raise GraphLayoutError(f"generate: steps={steps}, expected at least 1")
        cache = self.new_cache()
        prompt_logits = self.forward(prompt, cache)
        rows = [prompt_logits[-1]]
        tokens = [int(torch.argmax(rows[-1]))]
        for _ in range(steps - 1):
            rows.append(self.forward([tokens[-1]], cache)[-1])
            tokens.append(int(torch.argmax(rows[-1])))
        return Generation(prompt_logits, tuple(tokens), torch.stack(rows))


def _held_tensors(weights: RankWeights) -> list[tuple[str, torch.Tensor]]:
    """The float tensors a rank's weights hold (norms, biases), each with its name in errors."""
    held = [("final norm", weights.norm)] + [
        (f"layer {layer.index} {what}", tensor)
        for layer in weights.layers
        for what, tensor in (
            ("input norm", layer.input_norm),
            ("post-attention norm", layer.post_norm),
            ("q bias", layer.attention.q_bias),
            ("k bias", layer.attention.k_bias),
            ("v bias", layer.attention.v_bias),
        )
    ]
    return [(what, tensor) for what, tensor in held if tensor is not None]
