"""Split-point facts: where placement may cut each plane, so that the tile grid cuts there too (pure).

Placement (a later layer) splits a model's shared dims over ``tp`` ranks and its experts over ``ep``
ranks; a rank reads every tile its slice touches, so a split point inside a tile makes both ranks read
the whole tile. Which operator slots split along which logical axis, and the parameter spellings, are
the model family's (:func:`slot_split` and :func:`model_param` of
:mod:`shardport.registry.families.llama`, whose tables :mod:`shardport.placement.rules` splits by
too); this module owns the split arithmetic (:func:`split_points`, used by
:mod:`shardport.placement.splits`). From them :func:`plane_cuts` derives, for every plane of every
logical weight, the boundaries along its byte matrix's rows and column quanta that the planner can
produce for any ``tp`` (and ``ep``) in :data:`SPLITS`, and the unit no tile may cut (a quantization
group of a packed plane; GGUF blocks and packed words are already whole column quanta).

A ``tp`` that the planner refuses for the model as a whole (an attention split that would give a rank
two kv heads, a dim with fewer whole units than ranks, heads unknown) is left out for every weight of
the model: no rank plan can ask for its points. Weights whose slot does not split (norms, replicated
tensors) get only their unit. Getting a point wrong costs read amplification, never correctness: every
tile is still verified.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.contracts.model import (
    AffineIntContract,
    GroupMapIndex,
    LogicalWeight,
    MicroscaleContract,
    Packing,
    PlaneRef,
    ZeroFloatPlane,
    ZeroIntPlane,
)
from shardport.registry.families.llama import model_param, slot_split
from shardport.registry.formats.elements import DTYPE_BYTES

SPLITS = (2, 3, 4, 6, 8)
"""The tp (and ep) sizes tiles are cut for."""


def split_points(extent: int, unit: int, parts: int) -> tuple[int, ...] | None:
    """Interior points of the planner's split of ``[0, extent)`` into ``parts`` ranges on ``unit``.

    Even (``i * extent / parts``) when that is a whole multiple of ``unit``; otherwise each ideal point
    moved to the nearest multiple of ``unit`` (``unit * round(i * units / parts)``, ties up, with
    ``units = ceil(extent / unit)``); ``None`` when there are fewer whole units than parts.
    """
    if extent % parts == 0 and (extent // parts) % unit == 0:
        per = extent // parts
        return tuple(i * per for i in range(1, parts))
    units = -(-extent // unit)
    if units < parts:
        return None
    return tuple(unit * ((2 * i * units + parts) // (2 * parts)) for i in range(1, parts))


@dataclass(frozen=True, slots=True)
class AxisCuts:
    """Cuts along one axis of a byte matrix (rows, or column quanta).

    ``points`` must be tile boundaries; every tile boundary must be a multiple of ``unit``.
    """

    unit: int = 1
    points: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PlaneCuts:
    """The cuts of a plane's byte matrix along its rows and its column quanta."""

    rows: AxisCuts
    cols: AxisCuts


@dataclass(frozen=True, slots=True)
class _Map:
    """A physical dim following logical ``axis`` (None: never cut) as ``index = logical * num / den``."""

    axis: str | None
    num: int = 1
    den: int = 1
    group: int = 1  # logical elements per quantization group along this dim (1: none)

    @property
    def unit(self) -> int:
        return self.den // math.gcd(self.num, self.den)

    def at(self, x: int) -> int:
        return x * self.num // self.den


def _packed(packing: Packing, bits: int, axis: str, group: int) -> _Map:
    if packing.axis != axis:
        return _Map(axis, group=group)
    return _Map(axis, bits, packing.container_bits, group)


def _affine_maps(c: AffineIntContract | MicroscaleContract, plane: PlaneRef) -> tuple[_Map, ...] | None:
    if c.scales.group_axis != "K":
        return None
    act_order = isinstance(c.group_map, GroupMapIndex) and not c.group_map.sequential
    g = c.scales.group_size
    gdim = _Map(None) if act_order else _Map("K", 1, g)
    k_group = 1 if act_order else g
    zero = c.zero_point
    if plane.tensor == c.codes.plane:
        axes = c.codes.physical_axes
        return tuple(_packed(c.codes.packing, c.codes.bits, a, k_group if a == "K" else 1) for a in axes)
    if plane.tensor == c.scales.plane:
        return tuple(gdim if a == "G" else _Map("N") for a in c.scales.physical_axes)
    if isinstance(zero, ZeroIntPlane) and plane.tensor == zero.plane:
        return tuple(gdim if a == "G" else _packed(zero.packing, zero.bits, a, 1) for a in zero.physical_axes)
    if isinstance(zero, ZeroFloatPlane) and plane.tensor == zero.plane:
        return tuple(gdim if a == "G" else _Map(a) for a in zero.physical_axes)
    if plane.role == "g_idx":
        return (_Map("K"),)
    return None  # a permutation plane: read whole


def _maps(weight: LogicalWeight, plane: PlaneRef, entry: TensorEntry) -> tuple[_Map, ...] | None:
    """How each dim of ``entry`` (GGUF: its last dim in blocks) follows the weight's logical axes."""
    if tuple(entry.shape) != tuple(plane.shape) or not entry.shape:
        return None
    if isinstance(weight.contract, AffineIntContract | MicroscaleContract):
        maps = _affine_maps(weight.contract, plane)
    elif len(entry.shape) == len(weight.shape.axes):
        maps = tuple(_Map(a) for a in weight.shape.axes)
        block = BLOCK_SIZES.get(entry.dtype, (1, 0))[0]
        if block > 1:
            maps = (*maps[:-1], _Map(maps[-1].axis, 1, block))
    else:
        maps = None
    return maps if maps is not None and len(maps) == len(entry.shape) else None


def _unit_bytes(entry: TensorEntry) -> int | None:
    """Bytes per physical unit of the last dim (a GGUF block, or an element); None for sub-byte dtypes."""
    if entry.dtype in BLOCK_SIZES and BLOCK_SIZES[entry.dtype][0] > 1:
        return BLOCK_SIZES[entry.dtype][1]
    return DTYPE_BYTES.get(entry.dtype)


@dataclass
class _Dim:
    """A shared dim: its extent, its members' alignment units, and its points per tp."""

    extent: int
    units: set[int]
    points: dict[int, tuple[int, ...]]


def _constraint_units(maps: Mapping[str, tuple[_Map, ...]], axis: str) -> set[int]:
    return {m.unit for ms in maps.values() for m in ms if m.axis == axis and m.unit > 1}


def _attention(
    q: _Dim | None, kv: _Dim | None, heads: int | None, kv_heads: int | None, head_dim: int | None, tp: int
) -> bool:
    """Record a layer's heads and kv points at ``tp`` (as the planner splits them); False if it refuses."""
    if heads is None or head_dim is None:
        return False
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        return False
    group = heads // kv_heads
    q_unit = math.lcm(group * head_dim if tp <= kv_heads else head_dim, *(q.units if q else ()))
    q_pts = split_points(q.extent, q_unit, tp) if q is not None else None
    if q is not None:
        if q_pts is None:
            return False
        q.points[tp] = q_pts
    if kv is None:
        return True
    kv_unit = math.lcm(head_dim, *kv.units)
    if tp <= kv_heads:
        if q_pts is None:
            pts = split_points(kv.extent, kv_unit, tp)
        else:
            pts = tuple(p // group for p in q_pts)
            if any(p % kv_unit for p in pts):
                return False
        if pts is None:
            return False
        kv.points[tp] = pts
        return True
    if tp % kv_heads:
        return False
    owned = [r * kv_heads // tp for r in range(tp)]
    if q_pts is not None:
        bounds = [0, *q_pts, q.extent if q is not None else 0]
        for r, (a, b) in enumerate(itertools.pairwise(bounds)):
            first, last = a // head_dim // group, (b // head_dim - 1) // group
            if not owned[r] <= first <= last < owned[r] + 1:
                return False
    edges = {h * head_dim for h in owned} | {(h + 1) * head_dim for h in owned}
    if any(e % kv_unit for e in edges):
        return False
    kv.points[tp] = tuple(sorted(e for e in edges if 0 < e < kv.extent))
    return True


def _expert_points(count: int) -> tuple[int, ...]:
    """Boundaries between the contiguous expert blocks of every ep in :data:`SPLITS` (``ep <= count``)."""
    return tuple(
        sorted({-(-k * count // ep) for ep in SPLITS if ep <= count for k in range(1, ep)} - {0, count})
    )


def plane_cuts(
    weights: Iterable[LogicalWeight], tensors: Iterable[TensorEntry], params: Mapping[str, Any]
) -> dict[str, PlaneCuts]:
    """Cuts of every plane of ``weights`` (by tensor name; see the module docstring).

    Planes whose geometry cannot be followed (a sub-byte dtype, a permutation plane, a shape that
    disagrees with its weight) are left out: the grid's generic rule applies to them.
    """
    by_name = {e.name: e for e in tensors}
    placed: list[tuple[LogicalWeight, dict[str, tuple[_Map, ...]], tuple[str, str] | None]] = []
    for w in weights:
        maps = {}
        for plane in w.planes:
            entry = by_name.get(plane.tensor)
            found = _maps(w, plane, entry) if entry is not None else None
            if found is not None:
                maps[plane.tensor] = found
        placed.append((w, maps, slot_split(w.binding.slot, len(w.shape.axes))))
    dims: dict[str, _Dim] = {}
    member_of: dict[str, tuple[str, str]] = {}
    for w, maps, split in placed:
        if split is None:
            continue
        axis, kind = split
        extents = dict(zip(w.shape.axes, w.shape.extents, strict=True))
        if axis not in extents:
            continue
        # the planner's shared-dim key: layer, the slot's prefix (self_attn, mlp, mlp.shared_expert…), expert
        prefix = w.binding.slot.removesuffix(".bias").rpartition(".")[0]
        where = f"{w.binding.layer}.{prefix}.{w.binding.expert}" if kind != "vocab" else w.binding.slot
        key = f"{where}.{kind}"
        dim = dims.setdefault(key, _Dim(extents[axis], set(), {}))
        dim.units |= _constraint_units(maps, axis)
        member_of[w.name] = key, axis
    feasible = _feasible(dims, params)
    out: dict[str, PlaneCuts] = {}
    for w, maps, _ in placed:
        key, axis = member_of.get(w.name, ("", ""))
        shared = dims.get(key)
        logical: tuple[str, tuple[int, ...]] | None = None
        if shared is not None:
            logical = axis, tuple(sorted({p for tp in feasible for p in shared.points.get(tp, ())}))
        experts = _expert_points(w.shape.extents[0]) if w.shape.axes[0] == "E" else ()
        for name, ms in maps.items():
            cuts = _plane(by_name[name], ms, logical, experts)
            if cuts is not None:
                out[name] = cuts
    return out


def _feasible(dims: Mapping[str, _Dim], params: Mapping[str, Any]) -> list[int]:
    """The tps of :data:`SPLITS` the planner accepts for every shared dim (their points recorded)."""
    heads, kv_heads = model_param(params, "num_heads"), model_param(params, "num_kv_heads")
    head_dim = model_param(params, "head_dim")
    hidden = model_param(params, "hidden")
    if head_dim is None and heads and hidden and hidden % heads == 0:
        head_dim = hidden // heads
    feasible = []
    for tp in SPLITS:
        ok = True
        for key, dim in dims.items():
            base, _, kind = key.rpartition(".")
            if kind == "heads" or (kind == "kv" and f"{base}.heads" not in dims):
                ok &= _attention(
                    dim if kind == "heads" else None,
                    dims.get(f"{base}.kv"),
                    heads,
                    kv_heads,
                    head_dim,
                    tp,
                )
            elif kind != "kv":
                pts = split_points(dim.extent, math.lcm(1, *dim.units), tp)
                ok &= pts is not None
                if pts is not None:
                    dim.points[tp] = pts
        if ok:
            feasible.append(tp)
    return feasible


def _plane(
    entry: TensorEntry,
    maps: Sequence[_Map],
    logical: tuple[str, tuple[int, ...]] | None,
    experts: tuple[int, ...],
) -> PlaneCuts | None:
    """The plane's cuts: logical points mapped onto its dims, then onto rows and column quanta."""
    unit_bytes = _unit_bytes(entry)
    if unit_bytes is None:
        return None
    dims = list(entry.shape)
    block = BLOCK_SIZES.get(entry.dtype, (1, 0))[0]
    if block > 1:
        dims[-1] //= block
    per_dim: list[set[int]] = []
    units: list[int] = []
    for d, m in enumerate(maps):
        pts: set[int] = set()
        if m.axis == "E":
            pts = set(experts)
        elif logical is not None and m.axis == logical[0]:
            pts = {m.at(p) for p in logical[1]}
        per_dim.append({p for p in pts if 0 < p < dims[d]})
        units.append(max(1, m.at(m.group)) if m.group > 1 and m.at(m.group) * m.den == m.group * m.num else 1)
    if len(dims) == 1:
        return PlaneCuts(AxisCuts(), AxisCuts(units[0], tuple(sorted(per_dim[0]))))
    rows = AxisCuts(units[0], tuple(sorted(per_dim[0])))
    # the columns flatten dims 1..: a point p of dim d recurs in every index of the dims before it
    cols: set[int] = set()
    stride = 1
    col_unit = 1
    for d in range(len(dims) - 1, 0, -1):
        cols |= {p * stride for p in per_dim[d]}
        if per_dim[d] and d > 1:
            cols.add(dims[d] * stride)  # the pattern repeats every index of dim d - 1
        if d == len(dims) - 1:
            col_unit = units[d]
        stride *= dims[d]
    return PlaneCuts(rows, AxisCuts(col_unit, tuple(sorted(p for p in cols if 0 < p < stride))))
