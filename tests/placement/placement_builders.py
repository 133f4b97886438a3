"""Synthetic llama / MoE inventories for the placement tests.

Tensor inventories are built by name and shape as a checkpoint would list them (float, GPTQ, AWQ,
GGUF), run through the registry's contract inference, and laid out back to back in one or more files
(with optional padding between tensors), as a manifest's ``tensors`` section would record them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from shardport.placement import Inventory, Piece, Plan, coalesce, expert_owner
from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.contracts import TensorInfo, infer_gguf, infer_safetensors
from shardport.registry.contracts.encodings import DTYPE_BYTES
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES

HF_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
GGUF_NAMES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}


@dataclass(frozen=True)
class Shape:
    """A llama-family model shape; ``experts > 0`` makes the MLP a mixture of experts."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 256
    vocab: int = 96
    experts: int = 0
    tied: bool = False

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    def params(self) -> dict[str, Any]:
        out = {
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "hidden_size": self.hidden,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
        }
        if self.experts:
            out["num_local_experts"] = self.experts
        return out

    def matrices(self, layer: int) -> list[tuple[str, int, int]]:
        """HF module prefixes of one layer's matrices with their (N, K)."""
        hd, h = self.head_dim, self.hidden
        base = f"model.layers.{layer}"
        out = [
            (f"{base}.self_attn.q_proj", self.heads * hd, h),
            (f"{base}.self_attn.k_proj", self.kv_heads * hd, h),
            (f"{base}.self_attn.v_proj", self.kv_heads * hd, h),
            (f"{base}.self_attn.o_proj", h, self.heads * hd),
        ]
        mlps = (
            [f"{base}.mlp"] if not self.experts else [f"{base}.mlp.experts.{e}" for e in range(self.experts)]
        )
        for mlp in mlps:
            out += [
                (f"{mlp}.gate_proj", self.intermediate, h),
                (f"{mlp}.up_proj", self.intermediate, h),
                (f"{mlp}.down_proj", h, self.intermediate),
            ]
        return out


def tensor_bytes(info: TensorInfo) -> int:
    block, size = BLOCK_SIZES.get(info.dtype, (1, DTYPE_BYTES.get(info.dtype, 0)))
    return math.prod(info.shape[:-1]) * (info.shape[-1] // block) * size


def lay_out(infos: list[TensorInfo], files: int = 1, pad: int = 0, header: int = 64) -> list[TensorEntry]:
    """Place tensors back to back (round-robin over ``files``), ``pad`` bytes between them."""
    cursor = [header] * files
    out = []
    for i, info in enumerate(infos):
        f = i % files
        size = tensor_bytes(info)
        out.append(
            TensorEntry(
                name=info.name,
                file=f"model-{f:05d}.safetensors",
                start=cursor[f],
                end=cursor[f] + size,
                dtype=info.dtype,
                shape=info.shape,
            )
        )
        cursor[f] += size + pad
    return out


def _quantized(prefix: str, n: int, k: int, fmt: str, group: int) -> list[TensorInfo]:
    groups = -(-k // group)
    if fmt == "gptq":
        return [
            TensorInfo(f"{prefix}.qweight", "I32", (k // 8, n)),
            TensorInfo(f"{prefix}.qzeros", "I32", (groups, n // 8)),
            TensorInfo(f"{prefix}.scales", "F16", (groups, n)),
            TensorInfo(f"{prefix}.g_idx", "I32", (k,)),
        ]
    return [
        TensorInfo(f"{prefix}.qweight", "I32", (k, n // 8)),
        TensorInfo(f"{prefix}.qzeros", "I32", (groups, n // 8)),
        TensorInfo(f"{prefix}.scales", "F16", (groups, n)),
    ]


def safetensors_infos(shape: Shape, fmt: str = "float", group: int = 128) -> list[TensorInfo]:
    """The tensor list of a float, GPTQ or AWQ llama (or MoE) checkpoint."""
    h = shape.hidden
    infos = [TensorInfo("model.embed_tokens.weight", "F16", (shape.vocab, h))]
    for layer in range(shape.layers):
        base = f"model.layers.{layer}"
        infos += [
            TensorInfo(f"{base}.input_layernorm.weight", "F16", (h,)),
            TensorInfo(f"{base}.post_attention_layernorm.weight", "F16", (h,)),
        ]
        if shape.experts:
            infos.append(TensorInfo(f"{base}.mlp.gate.weight", "F16", (shape.experts, h)))
        for prefix, n, k in shape.matrices(layer):
            if fmt == "float":
                infos.append(TensorInfo(f"{prefix}.weight", "F16", (n, k)))
            else:
                infos += _quantized(prefix, n, k, fmt, group)
    infos.append(TensorInfo("model.norm.weight", "F16", (h,)))
    if not shape.tied:
        infos.append(TensorInfo("lm_head.weight", "F16", (shape.vocab, h)))
    return infos


def gguf_infos(shape: Shape, qtype: str = "Q4_1") -> list[TensorInfo]:
    """The tensor list of a GGUF llama (experts stacked ``[E, N, K]``)."""
    h = shape.hidden
    infos = [TensorInfo("token_embd.weight", qtype, (shape.vocab, h))]
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        infos += [
            TensorInfo(f"{blk}.attn_norm.weight", "F32", (h,)),
            TensorInfo(f"{blk}.ffn_norm.weight", "F32", (h,)),
        ]
        for prefix, n, k in shape.matrices(layer)[:4]:
            infos.append(TensorInfo(f"{blk}.{GGUF_NAMES[prefix.rsplit('.', 1)[1]]}.weight", qtype, (n, k)))
        i = shape.intermediate
        if shape.experts:
            e = shape.experts
            infos += [
                TensorInfo(f"{blk}.ffn_gate_inp.weight", "F32", (e, h)),
                TensorInfo(f"{blk}.ffn_gate_exps.weight", qtype, (e, i, h)),
                TensorInfo(f"{blk}.ffn_up_exps.weight", qtype, (e, i, h)),
                TensorInfo(f"{blk}.ffn_down_exps.weight", qtype, (e, h, i)),
            ]
        else:
            infos += [
                TensorInfo(f"{blk}.ffn_gate.weight", qtype, (i, h)),
                TensorInfo(f"{blk}.ffn_up.weight", qtype, (i, h)),
                TensorInfo(f"{blk}.ffn_down.weight", qtype, (h, i)),
            ]
    infos.append(TensorInfo("output_norm.weight", "F32", (h,)))
    if not shape.tied:
        infos.append(TensorInfo("output.weight", qtype, (shape.vocab, h)))
    return infos


def inventory(
    shape: Shape,
    fmt: str = "float",
    *,
    group: int = 128,
    act_order: bool = False,
    qtype: str = "Q4_1",
    files: int = 1,
    pad: int = 0,
) -> Inventory:
    """A whole inventory: inferred weights, laid-out tensors and the model parameters."""
    if fmt == "gguf":
        infos = gguf_infos(shape, qtype)
        weights = infer_gguf({"general.architecture": "llama"}, infos)
    else:
        infos = safetensors_infos(shape, fmt, group)
        config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": shape.tied}
        if fmt == "gptq":
            config["quantization_config"] = {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": group,
                "desc_act": act_order,
            }
        elif fmt == "awq":
            config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group}
        weights = infer_safetensors(config, infos)
    return Inventory(weights, tuple(lay_out(infos, files, pad)), shape.params())


def reads_of(plan: Plan, tensor: str) -> dict[int, Any]:
    """Each rank's read of ``tensor`` (ranks that do not read it are absent)."""
    return {r.rank: read for r in plan.ranks for read in r.reads if read.tensor == tensor}


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def check_plan(plan: Plan, inv: Inventory) -> None:
    """The invariants every plan keeps (used by the property and unit tests).

    - every read's pieces lie inside its tensor's byte range, and ``shape`` matches ``index``;
    - ``bytes_assigned`` is the sum of the rank's reads (no byte asked for twice);
    - per pp stage that needs a tensor, the distinct piece sets the stage's ranks read are pairwise
      disjoint and together cover the tensor exactly (replicated = one set covering it; split = the
      parts); stages that do not need it do not read it;
    - a per-expert tensor is read by exactly one ep rank per stage, its owner.
    """
    entries = {e.name: e for e in inv.tensors}
    weights = {w.name: w for w in inv.weights}
    topo = plan.topology
    by_stage: dict[tuple[str, int], dict[int, frozenset[tuple[int, int]]]] = {}
    for rank in plan.ranks:
        total = 0
        names = [read.tensor for read in rank.reads]
        assert len(names) == len(set(names)), f"rank {rank.rank} reads a tensor twice"
        for read in rank.reads:
            entry = entries[read.tensor]
            assert read.file == entry.file
            assert read.shape == tuple(b - a for a, b in read.index)
            assert all(0 <= a <= b <= d for (a, b), d in zip(read.index, entry.shape, strict=True))
            pieces = read.pieces
            for offset, length in pieces:
                assert length > 0 and entry.start <= offset and offset + length <= entry.end, read.tensor
            assert all(a + n < b for (a, n), (b, _) in itertools.pairwise(pieces)), "unmerged pieces"
            assert read.nbytes == sum(n for _, n in pieces)
            total += read.nbytes
            by_stage.setdefault((read.tensor, rank.pp_stage), {})[rank.rank] = frozenset(pieces)
        assert rank.bytes_assigned == total
        fetch = coalesce([Piece(r.file, o, n) for r in rank.reads for o, n in r.pieces], plan.max_gap)
        assert (rank.bytes_assigned, rank.bytes_fetched, rank.requests) == (
            fetch.requested_bytes,
            fetch.fetched_bytes,
            fetch.requests,
        )
    assert plan.totals.bytes_assigned == sum(r.bytes_assigned for r in plan.ranks)
    for (tensor, stage), sets in by_stage.items():
        entry = entries[tensor]
        distinct = set(sets.values())
        spans = sorted((o, o + n) for s in distinct for o, n in s)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"{tensor}: stage {stage} ranks read overlapping but different pieces"
        assert _merged(spans) == [(entry.start, entry.end)], f"{tensor}: stage {stage} does not cover it"
    for weight in weights.values():
        for plane in weight.planes:
            stages = {stage for (tensor, stage) in by_stage if tensor == plane.tensor}
            expected = _expected_stages(weight, plan)
            assert stages == expected, f"{plane.tensor}: read on stages {stages}, expected {expected}"
            if weight.binding.expert is not None:
                for stage in stages:
                    ep_ranks = {topo.coords(r).ep_rank for r in by_stage[(plane.tensor, stage)]}
                    owner = expert_owner(weight.binding.expert, plan.dims.num_experts, topo.ep)
                    assert ep_ranks == {owner}, f"{plane.tensor}: read by ep ranks {ep_ranks}"


def _expected_stages(weight: Any, plan: Plan) -> set[int]:
    binding, pp = weight.binding, plan.topology.pp
    if binding.layer is not None:
        return {s for s, (lo, hi) in enumerate(plan.stages) if lo <= binding.layer < hi}
    slots = {binding.slot, binding.tied_alias} - {None}
    out: set[int] = set()
    for slot in slots:
        out |= {0} if slot == "embed_tokens" else {pp - 1} if slot in ("lm_head", "norm") else set(range(pp))
    return out
