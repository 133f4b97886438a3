"""A rank's operators from its loaded tensors: quantized linears through the kernels, the rest as floats.

Pure of Ray and of torch.distributed: given a rank's verified tensors (:class:`~shardport.loader.RankTensors`)
and the manifest's logical weights, :func:`prepare_ops` describes each quantized linear weight for the
kernels (:func:`~shardport.kernels.rank_weight`), dispatches it for prefill and decode under the fallback
policy in the bring-up's activation dtype (``registry up --activations``:
:func:`~shardport.kernels.dispatch_activations`, which owns the float32 fallback),
and runs its parity ladder L0-L3; float weights (norms, float16 embeddings and heads) are decoded
by the registry's reference decoder into small float tensors. :func:`rank_weights` assembles the
graph's :class:`~shardport.deploy.graph.RankWeights` from them by the checkpoint's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shardport.kernels import (
    Device,
    DispatchTrace,
    FallbackPolicy,
    Ladder,
    PreparedLinear,
    default_catalog,
    dispatch_activations,
    ladder,
    ladder_sampled,
    note_float32,
    rank_weight,
)
from shardport.kernels.capability import ActivationDtype
from shardport.loader import RankTensors
from shardport.registry.contracts.decode import decode_weight
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.contracts.model import AffineIntContract, GgufBlockContract, LogicalWeight
from shardport.registry.families import llama

from .errors import GraphWeightError, UnsupportedModelError
from .graph.weights import (
    Attention,
    Experts,
    Layer,
    Linear,
    Lookup,
    Mlp,
    RankWeights,
    float_linear,
    float_lookup,
)
from .rank_experts import gguf_expert_names, split_experts, with_experts

_FLOAT_GGUF = frozenset({"F32", "F16", "BF16"})
#: Golden activation batches for L3 (decode T=1 and a short prefill), fixed seed.
L3_TOKENS = (1, 4)
#: The activation dtypes a bring-up runs its quantized operators in (``registry up --activations``):
#: float32 (parity first) or bfloat16 (torch's CPU int4pack fast path; the only dtype the CUDA int4
#: kernel takes).
ACTIVATIONS: tuple[ActivationDtype, ...] = ("float32", "bfloat16")
#: ``--activations`` choices: a dtype, or ``auto`` (the default), which each rank resolves by its device
#: (:func:`activations_for`).
ACTIVATION_CHOICES = ("auto", *ACTIVATIONS)


#: The output head, and the embedding it may be tied to, keep float32 activations under any
#: ``--activations``: their output is the logits, and logits rounded to bfloat16 (a step of 2^-8 of their
#: scale) tie at the top often enough to break L4's top-1 agreement and greedy tokens, which stay
#: absolute. One operator per token; a Q8_0 head's kernel (cpu.gguf-direct) computes float32 anyway.
LOGIT_WEIGHTS = llama.LOGIT_NAMES
HEAD_NOTE = "the output head keeps float32 activations (bfloat16 logits tie at the top)"


def activations_of(text: str) -> str:
    """``--activations TEXT`` checked: ``auto`` or a dtype (``ValueError`` naming the choices otherwise)."""
    if text not in ACTIVATION_CHOICES:
        raise ValueError(f"--activations {text!r}: expected one of {', '.join(ACTIVATION_CHOICES)}")
    return text


def activations_for(text: str, device_kind: str) -> ActivationDtype:
    """The dtype a rank on ``device_kind`` (cpu | cuda) runs for ``--activations TEXT``.

    ``auto``: float32 on a CPU rank (parity first), bfloat16 on a CUDA rank (the CUDA int4 kernel takes
    nothing else; a float32 request there refuses every int4 weight under the default policy).
    """
    choice = activations_of(text)
    if choice == "auto":
        return "bfloat16" if device_kind == "cuda" else "float32"
    return "bfloat16" if choice == "bfloat16" else "float32"


def policy_of(mode: str) -> FallbackPolicy:
    """The fallback policy of ``--fallback MODE``.

    ``forbid`` refuses generic kernels, full dequantization and conversions (a layout whose numbers differ
    from the stored ones: a scale cast to bfloat16, a rounding law the kernel does not follow); ``warn``
    (the default) warns on generic kernels, still refuses full dequantization (the kernels' default) and
    allows conversions; ``allow`` lets all three through (the evidence records what ran).
    """
    if mode == "warn":
        return FallbackPolicy()
    if mode in ("forbid", "allow"):
        return FallbackPolicy.from_cli(mode)  # type: ignore[arg-type]
    raise ValueError(f"--fallback {mode!r}: expected forbid, warn or allow")


def is_quantized(weight: LogicalWeight) -> bool:
    """A weight a kernel runs: affine integer codes, or GGUF blocks other than plain floats."""
    c = weight.contract
    if isinstance(c, AffineIntContract):
        return True
    return isinstance(c, GgufBlockContract) and c.ggml_type not in _FLOAT_GGUF


@dataclass
class RankOps:
    """What one rank prepared: operators per weight and phase, floats, traces, ladders, bytes."""

    ops: dict[str, dict[str, PreparedLinear]] = field(default_factory=dict)
    floats: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: dict[str, tuple[int, int]] = field(default_factory=dict)
    traces: list[DispatchTrace] = field(default_factory=list)
    ladders: list[Ladder] = field(default_factory=list)

    @property
    def operator_bytes(self) -> int:
        """Bytes the prepared operators keep alive (each operator once)."""
        seen = {id(op): op for phases in self.ops.values() for op in phases.values()}
        return sum(op.resident_bytes for op in seen.values())

    @property
    def float_bytes(self) -> int:
        """Bytes of the float tensors (norms, float embeddings and heads)."""
        return sum(t.numel() * t.element_size() for t in self.floats.values())

    def persistent_full_dequant(self) -> list[str]:
        """Weights whose selected operator holds a full-size float copy."""
        return sorted(
            name
            for name, phases in self.ops.items()
            if any(o.transformation == "full-dequant" for o in phases.values())
        )


def _groups(loaded: RankTensors) -> dict[str, tuple[dict[str, Any], dict[str, tuple[int, int]]]]:
    """Per logical weight: its planes by tensor name and its logical slice bounds by axis."""
    out: dict[str, tuple[dict[str, Any], dict[str, tuple[int, int]]]] = {}
    slices = {(r.tensor, tuple(r.index)): r.slice for r in loaded.plan.reads}
    for t in loaded.tensors:
        if t.weight is None:
            continue
        planes, bounds = out.setdefault(t.weight, ({}, {}))
        if t.tensor in planes:
            raise GraphWeightError(f"tensor {t.tensor}: the rank holds two pieces of it; the graph needs one")
        planes[t.tensor] = t.array
        s = slices.get((t.tensor, t.index))
        if s is not None:
            bounds.update({a: (int(b[0]), int(b[1])) for a, b in zip(s.axes, s.bounds, strict=True)})
    return split_experts(out)  # a stacked [E, N, K] weight: one [N, K] group per owned expert


def _golden(k: int, tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((tokens, k)).astype(np.float32)


def prepare_ops(
    loaded: RankTensors,
    weights: Mapping[str, LogicalWeight],
    *,
    policy: FallbackPolicy,
    required: tuple[str, ...] = (),
    preferred: tuple[str, ...] = (),
    device: Device | None = None,
    activations: ActivationDtype = "float32",
) -> RankOps:
    """Dispatch every quantized linear weight of the rank (prefill and decode), decode the float ones.

    ``device``: what the kernels' admission checks (default: this CPU; see :mod:`.devices`).
    ``activations``: the dtype each quantized operator is admitted with
    (:func:`~shardport.kernels.dispatch_activations`; an operator whose kernel does not take it runs
    float32, said in its trace), except the output head (:data:`LOGIT_WEIGHTS`: float32, said in its
    trace); float weights stay float32.
    """
    catalog = default_catalog()
    out = RankOps()
    weights = with_experts(weights)
    for name, (planes, bounds) in sorted(_groups(loaded).items()):
        weight = weights.get(name)
        if weight is None:
            raise GraphWeightError(f"weight {name}: loaded but not in the manifest's weights")
        if len(weight.shape.extents) == 1:
            out.floats[name] = torch.from_numpy(np.ascontiguousarray(decode_weight(weight, planes)))
            continue
        if len(weight.shape.extents) != 2:
            raise UnsupportedModelError(
                f"weight {name}: shape {list(weight.shape.extents)} (axes {list(weight.shape.axes)}); the "
                "bring-up runs 2-D linear weights and stacked [E, N, K] experts split over ep ranks"
            )
        rw = rank_weight(weight, planes, bounds)
        out.rows[name] = (rw.row_start, rw.row_start + rw.n_local)
        if not is_quantized(weight):
            local = decode_weight(rw.local_weight, rw.named_planes)
            out.floats[name] = torch.from_numpy(np.ascontiguousarray(local))
            continue
        head = activations != "float32" and name in LOGIT_WEIGHTS
        chosen = dispatch_activations(
            rw,
            catalog,
            "float32" if head else activations,
            policy=policy,
            required=required,
            preferred=preferred,
            device=device,
        )
        if head:
            chosen = note_float32(chosen, activations, HEAD_NOTE)
        out.ops[name] = {phase: op for phase, (op, _) in chosen.items()}
        out.traces += [trace for _, trace in chosen.values()]
    return out


def cache_tolerance(activations: str, base: float, layers: int, logit_scale: float) -> float:
    """The KV-cache check's tolerance on a rank: ``base`` in a float32 run.

    ``activations``: the dtype the run asked every rank for (the rank's resolved ``--activations``),
    not this rank's own operators': with pp > 1 the last stage's logits carry the earlier stages'
    roundings even where its own operators all fell back to float32.

    In a bfloat16 run a decode step and a fresh prefill can differ by more than float32's order
    of sums: a float32 difference upstream (attention over a different number of rows, a gemv against
    a gemm) can round an operator's input to the neighbouring bfloat16 value. One such step per block,
    relative to the logits' scale: ``floor · growth(layers) · max(1, max|logit|)``, L4's tolerance
    without its amplification (:data:`.up_evidence.L4_BUDGETS`), never below ``base``.
    """
    from .up_evidence import L4_BUDGETS

    dtype = "bfloat16" if activations == "bfloat16" else "float32"
    if dtype == "float32":
        return base
    budget = L4_BUDGETS[dtype]
    return max(base, budget.e_floor * budget.growth(layers) * max(1.0, logit_scale))


def run_ladders(
    loaded: RankTensors,
    weights: Mapping[str, LogicalWeight],
    ops: RankOps,
    *,
    mode: str | bool = "full",
) -> None:
    """Parity L0-L3 of the prepared operators under the budget ``mode`` (see :mod:`.ladder_budget`).

    Each kernel once per weight; ``full``: every level on every operator; ``sample``: the full ladder
    on one representative per class, L0, L1 and the L2 witness comparison on the others; ``off``:
    nothing. Appended to ``ops.ladders``.
    """
    from .ladder_budget import ladder_mode, plan_ladders

    groups = _groups(loaded)
    weights = with_experts(weights)
    tiles = loaded.ledger.tiles
    served: dict[int, list[str]] = {}
    for phases in ops.ops.values():
        for phase, o in phases.items():
            served.setdefault(id(o), []).append(phase)
    operators = [
        (name, o, served[id(o)])
        for name, phases in ops.ops.items()
        for o in {id(o): o for o in phases.values()}.values()
    ]
    described: dict[str, Any] = {}
    for item in plan_ladders(operators, ladder_mode(mode)):
        name = item.weight
        planes, bounds = groups[name]
        rw = described.get(name) or rank_weight(weights[name], planes, bounds)
        described[name] = rw
        verified = sum(len(tiles.get(t, ())) for t in planes)
        if item.representative is None:
            seed = sum(map(ord, name))
            batches = tuple(_golden(rw.k_local, t, seed + t) for t in L3_TOKENS)
            result = ladder(
                item.op,
                rw,
                manifest_digest=loaded.digest,
                verified_tiles=verified,
                activations=batches,
                ladder_class=item.ladder_class,
            )
        else:
            rep_planes, rep_bounds = groups[item.representative]
            rep = described.get(item.representative) or rank_weight(
                weights[item.representative], rep_planes, rep_bounds
            )
            result = ladder_sampled(
                item.op,
                rw,
                manifest_digest=loaded.digest,
                verified_tiles=verified,
                represented_by=rep.where,
                ladder_class=item.ladder_class,
            )
        ops.ladders.append(result)


def operator_linear(phases: Mapping[str, PreparedLinear]) -> Linear:
    """The graph's linear over a weight's prepared operators: the one place activations change dtype.

    One token runs the decode operator, more the prefill one; the input is cast to that operator's
    activation dtype (float32 or bfloat16, :func:`~shardport.kernels.dispatch_activations`) and its
    output back to float32, so the graph's norms, rotary, softmax, residual stream and KV cache stay float32.
    """
    prefill, decode = phases.get("prefill"), phases.get("decode")
    dtypes = {id(op): getattr(torch, op.op.activation_dtype) for op in phases.values()}

    def linear(x: torch.Tensor) -> torch.Tensor:
        op = decode if x.shape[0] == 1 and decode is not None else prefill or decode
        assert op is not None
        y: torch.Tensor = op(x.to(dtypes[id(op)]).contiguous())
        return y.to(torch.float32)

    return linear


def _rows_lookup(op: PreparedLinear, device: torch.device | None = None) -> Lookup:
    def lookup(ids: torch.Tensor) -> torch.Tensor:
        rows = [torch.from_numpy(op.decode_rows(int(i), int(i) + 1)) for i in ids.tolist()]
        return torch.cat(rows).to(device=device, dtype=torch.float32)

    return lookup


class _Slots:
    """The rank's operators by checkpoint name; float tensors moved to ``device`` (once each)."""

    def __init__(self, contract: GraphContract, ops: RankOps, device: torch.device | None = None) -> None:
        self.gguf, self.ops, self.device = contract.source == "gguf", ops, device

    def _float(self, name: str) -> torch.Tensor:
        t = self.ops.floats[name]
        if self.device is not None and t.device != self.device:
            t = self.ops.floats[name] = t.to(self.device)  # moved: no host copy stays behind
        return t

    def name(self, layer: int, op: str, leaf: str = "weight") -> str:
        return llama.layer_name(layer, op, self.gguf, leaf)

    def linear(self, name: str) -> Linear:
        if name in self.ops.ops:
            return operator_linear(self.ops.ops[name])
        if name in self.ops.floats:
            return float_linear(self._float(name))
        raise GraphWeightError(f"weight {name}: the rank's operators lack it (the plan did not assign it)")

    def lookup(self, name: str) -> Lookup:
        if name in self.ops.ops:
            phases = self.ops.ops[name]
            return _rows_lookup(phases.get("decode") or next(iter(phases.values())), self.device)
        if name in self.ops.floats:
            return float_lookup(self._float(name))
        raise GraphWeightError(f"weight {name}: the rank's operators lack it (the plan did not assign it)")

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.ops.floats:
            raise GraphWeightError(f"weight {name}: the rank has no float tensor of it")
        return self._float(name)

    def bias(self, layer: int, op: str, needed: bool) -> torch.Tensor | None:
        name = self.name(layer, op, "bias")
        return self._float(name) if needed and name in self.ops.floats else None


def _experts(s: _Slots, layer: int, experts: range) -> Experts:
    if s.gguf:  # stacked [E, N, K]: each owned expert's view (rank_experts.split_experts)
        owned = {e: Mlp(*(s.linear(n) for n in gguf_expert_names(layer, e))) for e in experts}
        return Experts(router=s.linear(s.name(layer, "router")), owned=owned)
    owned = {e: Mlp(*(s.linear(n) for n in llama.hf_expert_names(layer, e))) for e in experts}
    return Experts(router=s.linear(llama.hf_router_name(layer)), owned=owned)


def rank_weights(
    contract: GraphContract,
    ops: RankOps,
    layers: range,
    *,
    first: bool,
    last: bool,
    experts: range | None = None,
    device: torch.device | None = None,
) -> RankWeights:
    """The graph's weights of a rank holding ``layers`` (its stage) and ``experts`` (its ep rank's).

    ``device``: the rank's device; float tensors are moved there (``ops.floats`` then holds the device
    tensors, so no host copy stays behind; ``None``: they stay where they are) and rows a quantized
    embedding decodes are moved there. Kernel operators run where they were prepared.
    """
    s = _Slots(contract, ops, device)
    built = []
    for i in layers:
        att = Attention(
            q=s.linear(s.name(i, "q")),
            k=s.linear(s.name(i, "k")),
            v=s.linear(s.name(i, "v")),
            o=s.linear(s.name(i, "o")),
            q_bias=s.bias(i, "q", contract.qkv_bias),
            k_bias=s.bias(i, "k", contract.qkv_bias),
            v_bias=s.bias(i, "v", contract.qkv_bias),
        )
        mlp: Mlp | Experts
        if contract.moe:
            mlp = _experts(s, i, experts if experts is not None else range(contract.experts))
        else:
            mlp = Mlp(*(s.linear(s.name(i, op)) for op in llama.MLP_OPS))
        built.append(Layer(i, s.tensor(s.name(i, "input_norm")), att, s.tensor(s.name(i, "post_norm")), mlp))
    embed_name, norm_name, stored_head = llama.end_names(s.gguf, contract.tied_embeddings)
    head_name = embed_name if stored_head is None else stored_head
    embed: Lookup | None = s.lookup(embed_name) if first else None
    head: Linear | None = s.linear(head_name) if last else None
    norm = s.tensor(norm_name) if last else None
    return RankWeights(layers=tuple(built), embed=embed, norm=norm, head=head)
