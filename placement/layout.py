"""Physical layout of a plane: how each of its dims follows a logical axis, and its byte pieces.

A plane is read in *units*: elements for float and integer planes (a packed int32 plane's unit is one
int32 container), blocks for GGUF block types (``Q4_1``: 32 elements in 20 bytes). Each physical dim
follows a logical axis (``E``, ``N`` or ``K``) through ``index = logical * num / den``:

- unpacked dims: ``num = den = 1``;
- dims packed ``b``-bit codes into ``c``-bit containers: ``num = b, den = c`` (8 4-bit codes per int32);
- group dims (``G``) of scales and zero points: ``num = 1, den = group_size``;
- the block dim of a GGUF plane (its last): ``num = 1, den = block_size``.

A split point ``x`` on the logical axis lands on a unit boundary when ``x * num % den == 0``, so the
dim imposes the alignment unit ``den / gcd(num, den)``. Dims that no split may cut through are read
whole: the group dim when ``g_idx`` is in act order (any column may use any group), a permutation
plane, a shape plane.

Bytes are row-major: a range on the leading dims of a plane is one contiguous piece; a range on a
trailing dim is one piece per combination of the dims before it. Pieces are kept as strided runs
(a row split of an ``[N, K]`` plane is one run of N pieces), so plans of large models stay small.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.contracts.model import (
    AffineIntContract,
    GgufBlockContract,
    GroupMapIndex,
    LogicalWeight,
    MicroscaleContract,
    Packing,
    PlaneRef,
    ZeroFloatPlane,
    ZeroIntPlane,
)
from shardport.registry.formats.elements import DTYPE_BYTES

from .errors import InventoryError, UnsupportedSplitError

LogicalAxis = Literal["E", "N", "K"]
Range = tuple[int, int]
#: ``(offset, length, stride, count)``: ``count`` byte pieces of ``length``, ``stride`` apart.
Run = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Constraint:
    """A split along an axis must land on multiples of ``unit`` (``why``: e.g. ``group 128``)."""

    unit: int
    why: str
    source: str

    def __str__(self) -> str:
        return f"{self.why} ({self.source})"


@dataclass(frozen=True, slots=True)
class DimMap:
    """How one physical dim follows a logical axis (``axis=None``: always read whole)."""

    axis: LogicalAxis | None
    num: int = 1
    den: int = 1
    why: str = ""

    @property
    def unit(self) -> int:
        """Logical elements per whole physical unit along this dim."""
        return self.den // math.gcd(self.num, self.den)

    def span(self, bounds: Range) -> Range:
        """The physical index range holding logical ``[start, stop)``."""
        start, stop = bounds
        return start * self.num // self.den, -(-stop * self.num // self.den)


@dataclass(frozen=True, slots=True)
class PlaneLayout:
    """One plane's bytes: where they start, their unit grid, and how each dim follows the weight."""

    tensor: str
    role: str
    file: str
    start: int
    dims: tuple[int, ...]
    unit_bytes: int
    maps: tuple[DimMap, ...]
    entry_scale: tuple[int, ...]
    whole_along: tuple[tuple[LogicalAxis, str], ...] = ()

    def constraints(self, axis: LogicalAxis) -> list[Constraint]:
        """The alignment units this plane imposes on a split of ``axis``, with their reasons."""
        for blocked, why in self.whole_along:
            if blocked == axis:
                raise UnsupportedSplitError(
                    f"{self.tensor}: {why}; a split along {axis} is not possible — use tp=1 for this "
                    "weight's operator or re-export the checkpoint without it"
                )
        return [Constraint(m.unit, m.why, self.tensor) for m in self.maps if m.axis == axis and m.unit > 1]

    def index(self, bounds: Mapping[str, Range]) -> tuple[Range, ...]:
        """Physical unit ranges of the logical slice ``bounds`` (axes absent from it are whole)."""
        out = []
        for dim, m in zip(self.dims, self.maps, strict=True):
            if m.axis is None or m.axis not in bounds:
                out.append((0, dim))
            else:
                out.append(m.span(bounds[m.axis]))
        return tuple(out)

    def entry_index(self, index: tuple[Range, ...]) -> tuple[Range, ...]:
        """Unit ranges converted to the tensor's own shape (GGUF: elements, not blocks)."""
        return tuple((a * s, b * s) for (a, b), s in zip(index, self.entry_scale, strict=True))

    def runs(self, index: tuple[Range, ...]) -> tuple[Run, ...]:
        """Byte pieces of a unit-range box as strided runs ``(offset, length, stride, count)``.

        A run stands for the ``count`` pieces ``[offset + i*stride, offset + i*stride + length)``: the
        innermost cut dim gives the piece, the dim before it the repeat; every index of the dims
        further out gives one run. Runs come in increasing offset order.
        """
        if not self.dims:
            return ((self.start, self.unit_bytes, self.unit_bytes, 1),)
        if any(b <= a for a, b in index):
            return ()
        strides = [self.unit_bytes] * len(self.dims)
        for d in range(len(self.dims) - 2, -1, -1):
            strides[d] = strides[d + 1] * self.dims[d + 1]
        inner = len(self.dims) - 1
        while inner > 0 and index[inner] == (0, self.dims[inner]):
            inner -= 1
        length = (index[inner][1] - index[inner][0]) * strides[inner]
        base = self.start + index[inner][0] * strides[inner]
        if inner == 0:
            return ((base, length, length, 1),)
        (first, stop), stride = index[inner - 1], strides[inner - 1]
        count = stop - first
        base += first * stride
        outer = [range(a, b) for a, b in index[: inner - 1]]
        if count == 1:
            stride = length
        out = []
        for combo in itertools.product(*outer):
            offset = base + sum(i * s for i, s in zip(combo, strides, strict=False))
            out.append((offset, length, stride, count))
        return tuple(out)


def _packed(packing: Packing, bits: int, axis: str, what: str) -> DimMap:
    """The dim map of a packed dim (or an unpacked one when the packing is along another dim)."""
    if packing.axis != axis:
        return DimMap(_logical(axis))
    cb = packing.container_bits
    unit = cb // math.gcd(cb, bits)
    if packing.scheme == "slots":
        why = f"{unit} ({bits}-bit {what} per {cb}-bit word)"
    else:
        why = f"{unit} ({bits}-bit {what} filling whole {cb}-bit words)"
    return DimMap(_logical(axis), bits, cb, why)


_AXES: dict[str, LogicalAxis] = {"E": "E", "N": "N", "K": "K"}


def _logical(axis: str) -> LogicalAxis | None:
    return _AXES.get(axis)


def _group_map(contract: AffineIntContract | MicroscaleContract) -> DimMap:
    scales = contract.scales
    act_order = isinstance(contract.group_map, GroupMapIndex) and not contract.group_map.sequential
    if act_order:
        return DimMap(None, why="act-order g_idx: any column may use any group")
    return DimMap("K", 1, scales.group_size, f"group {scales.group_size}")


def _affine_maps(
    contract: AffineIntContract | MicroscaleContract, plane: PlaneRef
) -> tuple[tuple[DimMap, ...], tuple[tuple[LogicalAxis, str], ...]]:
    """Dim maps of one plane of an affine-int weight, by its role."""
    codes, zero = contract.codes, contract.zero_point
    if contract.scales.group_axis != "K":
        why = f"{contract.scales.plane} groups along N; placement splits only weights grouped along K"
        return tuple(DimMap(None) for _ in plane.shape), (("N", why), ("K", why))
    if plane.tensor == codes.plane:
        return tuple(_packed(codes.packing, codes.bits, a, "codes") for a in codes.physical_axes), ()
    if plane.tensor == contract.scales.plane:
        return tuple(
            _group_map(contract) if a == "G" else DimMap("N") for a in contract.scales.physical_axes
        ), ()
    if isinstance(zero, ZeroIntPlane | ZeroFloatPlane) and plane.tensor == zero.plane:
        maps = []
        for a in zero.physical_axes:
            if a == "G":
                maps.append(_group_map(contract))
            elif isinstance(zero, ZeroIntPlane):
                maps.append(_packed(zero.packing, zero.bits, a, "zero points"))
            else:
                maps.append(DimMap(_logical(a)))
        return tuple(maps), ()
    whole = tuple(DimMap(None) for _ in plane.shape)
    if plane.role == "g_idx":
        return (DimMap("K"),), ()
    if plane.role == "perm":
        return whole, (("K", "a permutation plane makes the columns a K slice needs value-dependent"),)
    return whole, ()


def _unit_size(entry: TensorEntry) -> tuple[int, int]:
    """(elements per unit along the last dim, bytes per unit) of a tensor's dtype."""
    if entry.dtype in BLOCK_SIZES:
        return BLOCK_SIZES[entry.dtype]
    if entry.dtype in DTYPE_BYTES:
        return 1, DTYPE_BYTES[entry.dtype]
    raise InventoryError(
        f"tensor {entry.name}: dtype {entry.dtype!r} is not a safetensors dtype or a ggml type placement "
        f"knows ({', '.join(sorted(set(DTYPE_BYTES) | set(BLOCK_SIZES)))})"
    )


def plane_layout(weight: LogicalWeight, plane: PlaneRef, entry: TensorEntry) -> PlaneLayout:
    """Build and check the layout of one plane of ``weight`` stored as ``entry``."""
    if tuple(entry.shape) != tuple(plane.shape) or entry.dtype != plane.dtype:
        raise InventoryError(
            f"{weight.name}: plane {plane.tensor} is {plane.dtype} {list(plane.shape)} in the weights "
            f"section but {entry.dtype} {list(entry.shape)} in the tensors section"
        )
    block, unit_bytes = _unit_size(entry)
    dims = list(entry.shape)
    scale = [1] * len(dims)
    if block > 1:
        if not dims or dims[-1] % block:
            raise InventoryError(
                f"tensor {entry.name}: {entry.dtype} rows are whole blocks of {block}, "
                f"but the last dim is {dims[-1] if dims else 'absent'}"
            )
        dims[-1] //= block
        scale[-1] = block
    contract = weight.contract
    blocked: tuple[tuple[LogicalAxis, str], ...] = ()
    if isinstance(contract, AffineIntContract | MicroscaleContract):
        maps, blocked = _affine_maps(contract, plane)
    elif len(dims) != len(weight.shape.axes):
        raise InventoryError(
            f"{weight.name}: plane {plane.tensor} has {len(dims)} dims, logical shape "
            f"{weight.shape.axes} has {len(weight.shape.axes)}"
        )
    else:
        maps = tuple(DimMap(a) for a in weight.shape.axes)
        if block > 1:
            name = contract.ggml_type if isinstance(contract, GgufBlockContract) else entry.dtype
            maps = (*maps[:-1], DimMap(maps[-1].axis, 1, block, f"{name} block {block}"))
    layout = PlaneLayout(
        plane.tensor,
        plane.role,
        entry.file,
        entry.start,
        tuple(dims),
        unit_bytes,
        maps,
        tuple(scale),
        blocked,
    )
    _check(weight, layout, entry)
    return layout


def _check(weight: LogicalWeight, layout: PlaneLayout, entry: TensorEntry) -> None:
    """The plane's dims must follow the logical extents, and its bytes fill its range exactly."""
    if len(layout.maps) != len(layout.dims):
        raise InventoryError(
            f"{weight.name}: plane {layout.tensor} has {len(layout.dims)} dims but its contract names "
            f"{len(layout.maps)} physical axes"
        )
    extents = dict(zip(weight.shape.axes, weight.shape.extents, strict=True))
    for dim, m in zip(layout.dims, layout.maps, strict=True):
        if m.axis is None:
            continue
        if m.axis not in extents:
            raise InventoryError(f"{weight.name}: plane {layout.tensor} follows axis {m.axis}, absent")
        expected = m.span((0, extents[m.axis]))[1]
        if dim != expected:
            raise InventoryError(
                f"{weight.name}: plane {layout.tensor} dim along {m.axis} is {dim}, expected "
                f"ceil({m.axis}={extents[m.axis]} * {m.num} / {m.den}) = {expected}"
            )
    size = math.prod(layout.dims) * layout.unit_bytes
    if size != entry.end - entry.start:
        raise InventoryError(
            f"tensor {entry.name}: {entry.dtype} {list(entry.shape)} is {size} bytes but its range "
            f"[{entry.start}, {entry.end}) holds {entry.end - entry.start}"
        )
