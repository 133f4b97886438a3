"""The float32 reference: a whole float model, its tensor-parallel shards, and parity between runs.

:class:`FloatModel` holds full float weights (row order as the contract's ``rope_pairs`` says).
:func:`tp_split` cuts heads, intermediate columns and vocabulary rows as the placement planner cuts
float weights (the registry's ``split_points``; query heads in whole kv groups while tp <= kv heads,
else single heads with kv heads replicated); :func:`shard` gives one rank its operators;
:func:`reference_model` is the same graph at tp = 1 in one process. :func:`compare` and
:func:`check_cache` turn two runs into plain parity records (L4 of the parity ladder).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict

from shardport.registry.contracts.graph import GraphContract
from shardport.registry.tiles.splits import split_points

from ..errors import GraphLayoutError
from .collectives import Mesh
from .layout import Range, RankLayout, single_layout
from .model import Generation, RankModel
from .weights import (
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


@dataclass(frozen=True, slots=True)
class FloatMlp:
    """Full SwiGLU weights: gate and up ``[I, H]``, down ``[H, I]``."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True, slots=True)
class FloatLayer:
    """Full weights of one layer (``mlp`` for dense layers, ``router`` + ``experts`` for MoE)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    mlp: FloatMlp | None = None
    router: torch.Tensor | None = None
    experts: tuple[FloatMlp, ...] = ()
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class FloatModel:
    """A whole model in float: embedding ``[V, H]``, layers, final norm, head (``None`` when tied)."""

    contract: GraphContract
    embed: torch.Tensor
    layers: tuple[FloatLayer, ...]
    norm: torch.Tensor
    head: torch.Tensor | None


def random_model(contract: GraphContract, seed: int = 0) -> FloatModel:
    """A model with Gaussian weights scaled to keep activations near unit size (tests, demos)."""
    g = torch.Generator().manual_seed(seed)
    h, i, d = contract.hidden, contract.intermediate, contract.head_dim

    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, generator=g).div(k**0.5)

    def norm() -> torch.Tensor:
        return torch.randn(h, generator=g).mul(0.1).add(1.0)

    def mlp() -> FloatMlp:
        return FloatMlp(w(i, h), w(i, h), w(h, i))

    layers = []
    for _ in range(contract.layers):
        q, k, v, o = (
            w(contract.heads * d, h),
            w(contract.kv_heads * d, h),
            w(contract.kv_heads * d, h),
            w(h, contract.heads * d),
        )
        bias = contract.qkv_bias
        layers.append(
            FloatLayer(
                q=q,
                k=k,
                v=v,
                o=o,
                input_norm=norm(),
                post_norm=norm(),
                mlp=None if contract.moe else mlp(),
                router=w(contract.experts, h) if contract.moe else None,
                experts=tuple(mlp() for _ in range(contract.experts)),
                q_bias=0.1 * torch.randn(q.shape[0], generator=g) if bias else None,
                k_bias=0.1 * torch.randn(k.shape[0], generator=g) if bias else None,
                v_bias=0.1 * torch.randn(v.shape[0], generator=g) if bias else None,
            )
        )
    embed = w(contract.vocab, h)  # rows of norm ~1: tied logits stay near unit size too
    head = None if contract.tied_embeddings else w(contract.vocab, h)
    return FloatModel(contract, embed, tuple(layers), norm(), head)


@dataclass(frozen=True, slots=True)
class TpSplit:
    """Per tp rank: query and kv head ranges, intermediate columns, vocabulary rows."""

    q_heads: tuple[Range, ...]
    kv_heads: tuple[Range, ...]
    intermediate: tuple[Range, ...]
    vocab: tuple[Range, ...]

    def layout(self, tp_rank: int) -> RankLayout:
        """The graph layout of ``tp_rank``."""
        return RankLayout(tp_rank, self.q_heads, self.kv_heads, self.vocab)


def _ranges(what: str, extent: int, unit: int, parts: int) -> tuple[Range, ...]:
    inner = split_points(extent, unit, parts)
    if inner is None:
        raise GraphLayoutError(
            f"{what}: {extent} in units of {unit} cannot give each of tp={parts} ranks one"
        )
    points = [0, *inner, extent]
    return tuple((points[r], points[r + 1]) for r in range(parts))


def tp_split(contract: GraphContract, tp: int) -> TpSplit:
    """The planner's tensor-parallel cuts of a float model of ``contract`` at ``tp``."""
    d, kv, group = contract.head_dim, contract.kv_heads, contract.group
    unit = group * d if tp <= kv else d
    q = tuple((a // d, b // d) for a, b in _ranges("query heads", contract.heads * d, unit, tp))
    if tp <= kv:
        kv_ranges = tuple((a // group, -(-b // group)) for a, b in q)
    elif tp % kv:
        raise GraphLayoutError(
            f"tp={tp} > kv heads={kv} and not a multiple of it: a rank would need two kv heads"
        )
    else:
        kv_ranges = tuple((r * kv // tp, r * kv // tp + 1) for r in range(tp))
    inter = _ranges("intermediate", contract.intermediate, 1, tp)
    return TpSplit(q, kv_ranges, inter, _ranges("vocabulary", contract.vocab, 1, tp))


def _mlp(m: FloatMlp, cols: Range, linear: Callable[[torch.Tensor], Linear]) -> Mlp:
    a, b = cols
    return Mlp(linear(m.gate[a:b]), linear(m.up[a:b]), linear(m.down[:, a:b]))


def _placing(
    make: Callable[[torch.Tensor], Linear], device: torch.device | None
) -> Callable[[torch.Tensor], Linear]:
    """``make`` given its slice on ``device`` (only the slice is copied there; ``None``: as it is)."""
    if device is None:
        return make
    return lambda t: make(t.to(device))


def _on(t: torch.Tensor | None, device: torch.device | None) -> torch.Tensor | None:
    return t if t is None or device is None else t.to(device)


def single_split(contract: GraphContract) -> TpSplit:
    """The split of a tp group of one: every head, column and vocabulary row on rank 0."""
    c = contract
    return TpSplit(((0, c.heads),), ((0, c.kv_heads),), ((0, c.intermediate),), ((0, c.vocab),))


def shard_layer(
    f: FloatLayer,
    index: int,
    contract: GraphContract,
    split: TpSplit,
    tp_rank: int,
    *,
    experts: Sequence[int] | None = None,
    linear: Callable[[torch.Tensor], Linear] = float_linear,
    device: torch.device | None = None,
) -> Layer:
    """Rank ``tp_rank``'s operators of one float layer (``index`` in the model), its ep rank's ``experts``.

    ``device``: where the rank's slices (and norms, biases) are placed; ``None`` leaves them where they are.
    """
    d = contract.head_dim
    linear = _placing(linear, device)
    (qa, qb), (ka, kb) = split.q_heads[tp_rank], split.kv_heads[tp_rank]
    cols = split.intermediate[tp_rank]
    owned = range(contract.experts) if experts is None else experts
    q_rows, kv_rows = slice(qa * d, qb * d), slice(ka * d, kb * d)
    attention = Attention(
        q=linear(f.q[q_rows]),
        k=linear(f.k[kv_rows]),
        v=linear(f.v[kv_rows]),
        o=linear(f.o[:, q_rows]),
        q_bias=None if f.q_bias is None else _on(f.q_bias[q_rows], device),
        k_bias=None if f.k_bias is None else _on(f.k_bias[kv_rows], device),
        v_bias=None if f.v_bias is None else _on(f.v_bias[kv_rows], device),
    )
    mlp: Mlp | Experts
    if f.router is not None:
        mlp = Experts(linear(f.router), {e: _mlp(f.experts[e], cols, linear) for e in owned})
    else:
        assert f.mlp is not None
        mlp = _mlp(f.mlp, cols, linear)
    norms = _on(f.input_norm, device), _on(f.post_norm, device)
    assert norms[0] is not None and norms[1] is not None
    return Layer(index, norms[0], attention, norms[1], mlp)


def shard(
    model: FloatModel,
    split: TpSplit,
    tp_rank: int,
    *,
    layers: range | None = None,
    experts: Sequence[int] | None = None,
    first: bool = True,
    last: bool = True,
    linear: Callable[[torch.Tensor], Linear] = float_linear,
    lookup: Callable[[torch.Tensor], Lookup] = float_lookup,
    device: torch.device | None = None,
) -> RankWeights:
    """Rank ``tp_rank``'s operators for the ``layers`` of its stage and the ``experts`` its ep rank owns.

    ``device``: the rank's device; its slices are copied there (``None``: they stay where they are).
    """
    c = model.contract
    v0, v1 = split.vocab[tp_rank]
    out = tuple(
        shard_layer(
            model.layers[index], index, c, split, tp_rank, experts=experts, linear=linear, device=device
        )
        for index in (layers if layers is not None else range(c.layers))
    )
    head = model.embed if model.head is None else model.head
    return RankWeights(
        layers=out,
        embed=_placing(lookup, device)(model.embed[v0:v1]) if first else None,
        norm=_on(model.norm, device) if last else None,
        head=_placing(linear, device)(head[v0:v1]) if last else None,
    )


def reference_model(model: FloatModel, device: torch.device | None = None) -> RankModel:
    """The whole model in this process (tp = ep = pp = 1), float32: the L4 reference (on ``device``)."""
    c = model.contract
    weights = shard(model, single_split(c), 0, device=device)
    return RankModel(c, single_layout(c), weights, Mesh.local(), device=device)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Parity(_Record):
    """Logits of a run against the reference's: the prompt positions and the greedy decode."""

    positions: int
    max_abs_diff: float
    top1_agree: tuple[bool, ...]
    tokens: tuple[int, ...]
    """The run's greedy tokens."""
    reference_tokens: tuple[int, ...]
    """The reference's argmax at each decode position. The driver's reference is teacher-forced (one
    pass over the prompt and the run's tokens, :func:`~.staged.teacher_forced`): equal to ``tokens``
    exactly when the reference's greedy decode would have chosen the same tokens; after a first
    mismatch at step j the later entries are its argmax given the run's tokens, not its own greedy
    continuation."""
    decode_max_abs_diff: float
    tolerance: float
    degenerate_positions: tuple[int, ...] = ()
    """Prompt positions whose logits (the run's or the reference's) are not all finite or all equal: a
    top-1 there proves nothing, so it does not agree (:func:`degenerate_rows`)."""
    degenerate_steps: tuple[int, ...] = ()
    """Decode steps whose logits (the run's or the reference's) are not all finite or all equal: the
    greedy tokens are not identical evidence there."""
    per_position_abs_diff: tuple[float, ...] = ()
    """``max |Δ|`` over the vocabulary at each prompt position (the report's L4 chart)."""
    decode_per_step_abs_diff: tuple[float, ...] = ()
    """``max |Δ|`` over the vocabulary at each decode step."""
    reference: dict[str, str] | None = None
    """What computed the reference: ``{"kind": "transformers", "version", "class"}`` (transformers' own
    decoder layers, :mod:`shardport.deploy.reference_hf`) or ``{"kind": "shardport-graph", "why"}``."""

    @property
    def ok(self) -> bool:
        """Within tolerance (a NaN never is), top-1 equal at every position, the same greedy tokens."""
        return (
            self.max_abs_diff <= self.tolerance
            and self.decode_max_abs_diff <= self.tolerance
            and all(self.top1_agree)
            and self.tokens == self.reference_tokens
            and not self.degenerate_steps
        )


class CacheCheck(_Record):
    """Decode steps through the KV cache against a fresh prefill of the whole prefix."""

    steps: int
    max_abs_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        """Every decode step's logits equal the prefill's last position within tolerance."""
        return self.max_abs_diff <= self.tolerance


def degenerate_rows(logits: torch.Tensor) -> torch.Tensor:
    """Per row of ``[T, vocab]`` logits: True where a value is NaN or infinite, or all are equal.

    An argmax over such a row is an artefact (the first index), not the model's choice: two runs whose
    logits are all NaN, or all zero, agree on it and prove nothing.
    """
    if logits.shape[-1] == 0:
        return torch.ones(logits.shape[:-1], dtype=torch.bool)
    finite = torch.isfinite(logits).all(-1)
    return ~finite | (logits.amax(-1) == logits.amin(-1))


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b|``; NaN when either holds a NaN or the same infinity (never a finite hiding one)."""
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max())


def _rows_max_abs(a: torch.Tensor, b: torch.Tensor) -> tuple[float, ...]:
    """``max |a - b|`` of each row (NaN where a row holds one, as :func:`_max_abs`)."""
    if a.numel() == 0:
        return ()
    return tuple(float(x) for x in (a - b).abs().amax(-1))


def compare(
    run: Generation, reference: Generation, tolerance: float, source: Mapping[str, str] | None = None
) -> Parity:
    """Parity of ``run`` against ``reference`` (same prompt, same number of steps).

    ``source``: what computed the reference (:attr:`Parity.reference`).

    A position or step whose logits are degenerate on either side (:func:`degenerate_rows`) never
    agrees; a non-finite logit makes ``max |Δ|`` NaN or inf (the evidence fails that row).
    """
    if run.prompt_logits.shape != reference.prompt_logits.shape:
        raise GraphLayoutError(
            f"compare: logits {list(run.prompt_logits.shape)} "
            f"vs reference {list(reference.prompt_logits.shape)}"
        )
    steps = min(len(run.tokens), len(reference.tokens))
    bad = degenerate_rows(run.prompt_logits) | degenerate_rows(reference.prompt_logits)
    same = run.prompt_logits.argmax(-1) == reference.prompt_logits.argmax(-1)
    run_steps, ref_steps = run.token_logits[:steps], reference.token_logits[:steps]
    bad_steps = degenerate_rows(run_steps) | degenerate_rows(ref_steps)
    return Parity(
        positions=run.prompt_logits.shape[0],
        max_abs_diff=_max_abs(run.prompt_logits, reference.prompt_logits),
        top1_agree=tuple(bool(x) for x in same & ~bad),
        tokens=run.tokens,
        reference_tokens=reference.tokens,
        decode_max_abs_diff=_max_abs(run_steps, ref_steps),
        tolerance=tolerance,
        degenerate_positions=tuple(int(i) for i in torch.nonzero(bad).flatten()),
        degenerate_steps=tuple(int(i) for i in torch.nonzero(bad_steps).flatten()),
        per_position_abs_diff=_rows_max_abs(run.prompt_logits, reference.prompt_logits),
        decode_per_step_abs_diff=_rows_max_abs(run_steps, ref_steps),
        reference=None if source is None else dict(source),
    )


def check_cache(model: RankModel, prompt: Sequence[int], run: Generation, tolerance: float) -> CacheCheck:
    """One fresh prefill of prompt + every decoded token but the last, against the decode steps.

    Attention is causal, so the prefill's row at position ``len(prompt) - 1 + i`` is what a fresh
    prefill of the first ``len(prompt) + i`` tokens yields at its last position: decode step ``i``'s
    logits (computed through the KV cache) must match it. One forward over the whole sequence checks
    every step at once (every rank calls it: the forward is collective).
    """
    steps = len(run.tokens) - 1
    if steps < 1:
        return CacheCheck(steps=0, max_abs_diff=0.0, tolerance=tolerance)
    logits = model.forward([*prompt, *run.tokens[:-1]], model.new_cache())
    fresh = logits[len(prompt) :]
    if fresh.shape[0] != steps:
        raise GraphLayoutError(f"check_cache: {fresh.shape[0]} fresh rows for {steps} decode steps")
    worst = float((fresh - run.token_logits[1:]).abs().max())
    return CacheCheck(steps=steps, max_abs_diff=worst, tolerance=tolerance)
