"""Splitting one dim over tp ranks without cutting a group, block, packed word or head.

An *even* split gives every rank ``extent / parts``; it is taken when that is a whole number and a
multiple of the alignment unit (the lcm of every constraint: quantization group, GGUF block, packed
container word, head_dim). Otherwise policy ``refuse`` raises :class:`SplitRefusedError` with the
arithmetic, and policy ``align`` moves each ideal point ``i * extent / parts`` to the nearest multiple
of the unit and records the uneven sizes. A repack that changes the grouping is a numerical conversion
and never happens here.

Attention is split by query groups: with tp <= kv heads, the query split lands on whole groups
(``heads / kv_heads`` query heads per kv head) and the kv split follows it; with tp > kv heads, rank
``r`` holds kv head ``r * kv_heads // tp`` (each on ``tp / kv_heads`` ranks). Either way every rank
holds the kv heads its query heads attend with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardport.registry.families.llama import CONFIG_KEYS as _KEYS
from shardport.registry.tiles.splits import split_points

from .errors import SplitRefusedError, UnsplittableError
from .layout import Constraint
from .plan import Policy, Range, SplitRecord


@dataclass(frozen=True, slots=True)
class Dim:
    """A shared dim to split: its key, the axis of its members, extent, constraints, members."""

    key: str
    axis: str
    extent: int
    constraints: tuple[Constraint, ...]
    members: tuple[str, ...]

    @property
    def where(self) -> str:
        """``<first member>: <axis>=<extent>``, the start of every message about this dim."""
        return f"{self.members[0]}: {self.axis}={self.extent}"


def _lcm(constraints: Sequence[Constraint]) -> int:
    unit = 1
    for constraint in constraints:
        unit = math.lcm(unit, constraint.unit)
    return unit


def _good_parts(extent: int, unit: int, limit: int = 64) -> list[int]:
    return [1] + [p for p in range(2, limit + 1) if extent % p == 0 and (extent // p) % unit == 0]


def _record(dim: Dim, parts: int, unit: int, kind: str, ranges: Sequence[Range], detail: str) -> SplitRecord:
    return SplitRecord.model_validate(
        {
            "key": dim.key,
            "axis": dim.axis,
            "extent": dim.extent,
            "parts": parts,
            "unit": unit,
            "constraints": tuple(map(str, dim.constraints)),
            "members": dim.members,
            "kind": kind,
            "ranges": tuple(ranges),
            "detail": detail,
        }
    )


def split_dim(dim: Dim, parts: int, policy: Policy) -> SplitRecord:
    """Split ``[0, extent)`` into ``parts`` ranges honouring every constraint (see module docstring)."""
    extent, unit = dim.extent, _lcm(dim.constraints)
    if extent % parts == 0 and (extent // parts) % unit == 0:
        per = extent // parts
        ranges = [(i * per, (i + 1) * per) for i in range(parts)]
        return _record(dim, parts, unit, "even", ranges, f"{dim.axis}={extent} / tp={parts} = {per} per rank")
    good = _good_parts(extent, unit)
    if extent % parts:
        arithmetic = f"{dim.where} is not divisible by tp={parts} ({extent}/{parts} = {extent / parts:.2f})"
    else:
        per = extent // parts
        cut = next(c for c in dim.constraints if per % c.unit)
        arithmetic = f"{dim.where} per rank {per} is not a multiple of {cut.why} (tp={parts}; {cut.source})"
    if policy == "refuse":
        raise SplitRefusedError(
            f"{arithmetic}; an even split would cut it — use policy 'align' to move split points to "
            f"multiples of {unit}, or tp in {good}"
        )
    units = -(-extent // unit)
    inner = split_points(extent, unit, parts)
    if inner is None:
        raise UnsplittableError(
            f"{dim.where} holds {units} whole unit(s) of {unit} "
            f"({'; '.join(map(str, dim.constraints))}); tp={parts} ranks cannot each get one — "
            f"use tp in {good}"
        )
    points = [0, *inner, extent]
    ranges = [(points[i], points[i + 1]) for i in range(parts)]
    sizes = [b - a for a, b in ranges]
    detail = f"{arithmetic}; split points moved to multiples of {unit}: sizes {sizes}"
    return _record(dim, parts, unit, "aligned", ranges, detail)


def _check_on_units(dim: Dim, ranges: Sequence[Range], detail: str) -> None:
    for start, _ in ranges:
        for c in dim.constraints:
            if start % c.unit:
                raise UnsplittableError(
                    f"{dim.where}: split point {start} ({detail}) is not a multiple of {c}"
                )


def split_attention(
    q: Dim | None, kv: Dim | None, heads: int, kv_heads: int, head_dim: int, parts: int, policy: Policy
) -> list[SplitRecord]:
    """Split a layer's query-head dim ``q`` and kv-head dim ``kv`` together (see module docstring)."""
    group = heads // kv_heads
    out: list[SplitRecord] = []
    q_record: SplitRecord | None = None
    if q is not None:
        q_unit = (
            Constraint(
                group * head_dim, f"query group {group} heads * head_dim {head_dim}", "model parameters"
            )
            if parts <= kv_heads
            else Constraint(head_dim, f"head_dim {head_dim}", "model parameters")
        )
        q_record = split_dim(Dim(q.key, q.axis, q.extent, (q_unit, *q.constraints), q.members), parts, policy)
        out.append(q_record)
    if kv is None:
        return out
    head = Constraint(head_dim, f"head_dim {head_dim}", "model parameters")
    kv = Dim(kv.key, kv.axis, kv.extent, (head, *kv.constraints), kv.members)
    unit = _lcm(kv.constraints)
    if parts <= kv_heads and q_record is not None:
        ranges = [(a // group, b // group) for a, b in q_record.ranges]
        detail = f"follows {q_record.key} / {group} query heads per kv head"
        _check_on_units(kv, ranges, detail)
        out.append(_record(kv, parts, unit, q_record.kind, ranges, detail))
    elif parts <= kv_heads:
        out.append(split_dim(kv, parts, policy))
    else:
        if parts % kv_heads:
            raise UnsplittableError(
                f"{kv.where}: tp={parts} > kv heads={kv_heads} and {parts} is not a multiple of "
                f"{kv_heads}: some rank's query heads would attend with two kv heads — use tp in "
                f"{[t for t in range(1, 65) if kv_heads % t == 0 or (t % kv_heads == 0 and heads % t == 0)]}"
            )
        owned = [r * kv_heads // parts for r in range(parts)]
        ranges = [(h * head_dim, (h + 1) * head_dim) for h in owned]
        detail = f"tp={parts} > kv heads={kv_heads}: rank r holds kv head r*{kv_heads}//{parts} = {owned}"
        _check_on_units(kv, ranges, detail)
        out.append(_record(kv, parts, unit, "heads_replicated", ranges, detail))
    if q_record is not None:
        _check_groups(q_record, out[-1], group, head_dim)
    return out


def _check_groups(q: SplitRecord, kv: SplitRecord, group: int, head_dim: int) -> None:
    """Every rank must hold the kv heads its query heads attend with."""
    for rank, ((qa, qb), (ka, kb)) in enumerate(zip(q.ranges, kv.ranges, strict=True)):
        first, last = qa // head_dim // group, (qb // head_dim - 1) // group
        if not ka // head_dim <= first <= last < kb // head_dim:
            raise UnsplittableError(
                f"{q.members[0]}: rank {rank} holds query heads {qa // head_dim}..{qb // head_dim - 1}, "
                f"which attend with kv heads {first}..{last}, but holds kv heads "
                f"{ka // head_dim}..{kb // head_dim - 1}; use a tp that divides {_KEYS['heads']}"
            )
