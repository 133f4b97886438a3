"""Semantic gates: whether a contract fits the logical shape, the tensor inventory and the planes.

Three layers, cheapest first, each raising its own :mod:`.errors` class:

1. :func:`check_contract` — the contract against the logical shape (metadata only): plane shape
   equations, scale shape ``[N, ceil(K/G)]`` on the declared axes, tail group, scale format vs dtype.
2. :func:`check_inventory` — the contract against the checkpoint's tensors (dtype, shape, presence).
3. :func:`check_values` — the planes' contents: code and padding ranges, finite scales of the declared
   sign, zero points in range, g_idx and permutation consistency.

:func:`run_gates` runs all that apply and returns a :class:`GateReport`. A swapped nibble order passes
every gate (all orders are valid bytes); the decode witness catches it (:mod:`.witness`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from . import microscaling, plane_values
from .errors import (
    PlaneMissingError,
    PlaneShapeError,
    ScaleFormatError,
    ScaleNarrowingError,
    ScaleShapeError,
    ScaleValueError,
    TailGroupError,
    UnsupportedContractError,
)
from .formats import as_plane
from .gguf_blocks import BLOCK_SIZES, SCALE_RULES, gguf_block_scales, row_bytes
from .model import (
    AffineIntContract,
    CodesSpec,
    Contract,
    GgufBlockContract,
    GlobalScalePlane,
    GroupMapIndex,
    LogicalShape,
    LogicalWeight,
    MicroscaleContract,
    PermutationPlane,
    ScaleSpec,
    TensorInfo,
    ZeroFloatPlane,
    ZeroIntPlane,
    contract_planes,
)
from .packing import (
    packed_extent,
    tail_is_exact,
)

Planes = Mapping[str, npt.NDArray[np.generic]]

#: scale format → (physical dtypes that hold it, storage)
_SCALE_DTYPES: dict[str, tuple[tuple[str, ...], str]] = {
    "binary32": (("F32",), "numeric"),
    "binary16": (("F16",), "numeric"),
    "bfloat16": (("BF16",), "numeric"),
    "e8m0": (("U8", "F8_E8M0"), "raw_bits"),
    "e4m3": (("F8_E4M3", "U8"), "raw_bits"),
}
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


class GateReport(BaseModel):
    """The gates a logical weight passed, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: str
    passed: tuple[str, ...]


def _axes_shape(axes: tuple[str, ...], extents: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(extents[axis] for axis in axes)


def expected_codes_shape(codes: CodesSpec, n: int, k: int) -> tuple[int, ...]:
    """Physical shape of the codes plane implied by ``[N, K]``, bits and packing."""
    extents = {"N": n, "K": k}
    if codes.packing.axis != "none":
        extents[codes.packing.axis] = packed_extent(extents[codes.packing.axis], codes.bits, codes.packing)
    return _axes_shape(codes.physical_axes, extents)


def _check_tail(weight: str, scales: ScaleSpec, k: int) -> None:
    groups = -(-k // scales.group_size)
    if scales.group_count != groups:
        raise TailGroupError(
            weight,
            "scales.group_count",
            f"{groups} (= ceil(K={k} / G={scales.group_size}))",
            scales.group_count,
            "the last, partial group along K needs its own scale",
        )
    if k % scales.group_size and scales.tail_rule == "exact":
        raise TailGroupError(
            weight,
            "scales.tail_rule",
            f"partial_last (K={k} is not a multiple of G={scales.group_size})",
            "exact",
        )


def _check_scale_shape(weight: str, scales: ScaleSpec, shape: tuple[int, ...], n: int, k: int) -> None:
    expected = _axes_shape(scales.physical_axes, {"N": n, "G": scales.group_count})
    if tuple(shape) == expected:
        return
    found = dict(zip(scales.physical_axes, shape, strict=False))
    if len(shape) == len(expected) and found.get("N") == n and found.get("G") == k // scales.group_size:
        raise TailGroupError(
            weight,
            f"{scales.plane} shape",
            f"{list(expected)} (G = ceil(K/G))",
            list(shape),
            "the plane drops the last, partial group",
        )
    raise ScaleShapeError(
        weight,
        f"{scales.plane} shape",
        f"{list(expected)} on axes {scales.physical_axes} (N={n}, G=ceil({k}/{scales.group_size}))",
        list(shape),
        "a scale grouped along N, or one that only broadcasts, is not this contract's per-group scale",
    )


def _check_scale_format(weight: str, scales: ScaleSpec, dtype: str) -> None:
    holders, storage = _SCALE_DTYPES[scales.format]
    if scales.format == "e8m0" and dtype in _FLOAT_DTYPES:
        raise ScaleNarrowingError(
            weight,
            f"{scales.plane} scales.format",
            f"a plane of {' or '.join(holders)} for e8m0",
            dtype,
            f"{dtype} scales are not powers of two; declaring them e8m0 would narrow them — declare the "
            "plane's own float format",
        )
    if dtype not in holders:
        raise ScaleFormatError(
            weight,
            f"{scales.plane} scales.format",
            f"dtype {' or '.join(holders)} for {scales.format}",
            dtype,
        )
    if scales.storage != storage:
        raise ScaleFormatError(weight, f"{scales.plane} scales.storage", storage, scales.storage)


def check_scale_plane(
    weight: str, scales: ScaleSpec, dtype: str, shape: tuple[int, ...], n: int, k: int
) -> None:
    """The scale plane's group count (tail), shape ``[N, ceil(K/G)]`` on its axes, and format vs dtype."""
    _check_tail(weight, scales, k)
    _check_scale_shape(weight, scales, shape, n, k)
    _check_scale_format(weight, scales, dtype)


def check_contract(weight: LogicalWeight) -> tuple[str, ...]:
    """Check the contract against the logical shape alone; return the gate names passed."""
    return check_contract_shape(weight.name, weight.contract, weight.shape)


def check_contract_shape(name: str, contract: Contract, shape: LogicalShape) -> tuple[str, ...]:
    """Check ``contract`` against a logical ``shape`` (the metadata half of :func:`check_contract`)."""
    if isinstance(contract, GgufBlockContract):
        row_bytes(contract.ggml_type, shape.columns, contract.plane)
        return ("contract.block_rows",)
    if isinstance(contract, MicroscaleContract):
        return microscaling.check_mx_shape(name, contract, shape)
    if not isinstance(contract, AffineIntContract):
        return ()
    if shape.axes != ("N", "K"):
        raise UnsupportedContractError(name, "shape.axes", "(N, K) for affine_int", shape.axes)
    n, k = shape.extents
    codes, scales = contract.codes, contract.scales
    expected = expected_codes_shape(codes, n, k)
    if codes.physical_shape != expected:
        raise PlaneShapeError(
            name,
            f"{codes.plane} shape",
            f"{list(expected)} for N={n}, K={k}, {codes.bits}-bit packed along {codes.packing.axis}",
            list(codes.physical_shape),
        )
    if codes.packing.tail == "exact" and not tail_is_exact(
        k if codes.packing.axis == "K" else n, codes.bits, codes.packing
    ):
        raise PlaneShapeError(
            name, "codes.packing.tail", "zero_fill (fields do not fill the last container)", "exact"
        )
    _check_tail(name, scales, k)
    _check_scale_shape(name, scales, scales.physical_shape, n, k)
    _check_scale_format(name, scales, scales.physical_dtype)
    zero = contract.zero_point
    if isinstance(zero, ZeroIntPlane | ZeroFloatPlane):
        extents = {"N": n, "G": scales.group_count}
        if isinstance(zero, ZeroIntPlane) and zero.packing.axis != "none":
            axis = zero.packing.axis
            extents[axis] = packed_extent(extents[axis], zero.bits, zero.packing)
        expected = _axes_shape(zero.physical_axes, extents)
        if zero.physical_shape != expected:
            raise PlaneShapeError(name, f"{zero.plane} shape", list(expected), list(zero.physical_shape))
    for extra in (contract.group_map, contract.permutation):
        if isinstance(extra, GroupMapIndex | PermutationPlane) and extra.physical_shape != (k,):
            raise PlaneShapeError(name, f"{extra.plane} shape", [k], list(extra.physical_shape))
    return (
        "contract.codes_shape",
        "contract.tail_group",
        "contract.scale_shape",
        "contract.scale_format",
        "contract.companion_shapes",
    )


def _declared(weight: LogicalWeight) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Declared (dtype, shape) of every plane the contract reads."""
    contract = weight.contract
    if isinstance(contract, GgufBlockContract):
        return {contract.plane: (contract.ggml_type, weight.shape.extents)}
    if not isinstance(contract, AffineIntContract | MicroscaleContract):
        return {contract.plane: (contract.physical_dtype, weight.shape.extents)}
    out = {
        contract.codes.plane: (contract.codes.physical_dtype, contract.codes.physical_shape),
        contract.scales.plane: (contract.scales.physical_dtype, contract.scales.physical_shape),
    }
    parts = (
        (contract.global_scale, contract.permutation)
        if isinstance(contract, MicroscaleContract)
        else (contract.zero_point, contract.group_map, contract.permutation)
    )
    for part in parts:
        if isinstance(
            part, ZeroIntPlane | ZeroFloatPlane | GroupMapIndex | PermutationPlane | GlobalScalePlane
        ):
            out[part.plane] = (part.physical_dtype, part.physical_shape)
    return out


def check_inventory(weight: LogicalWeight, inventory: Mapping[str, TensorInfo]) -> tuple[str, ...]:
    """Check that every plane the contract reads exists with the declared dtype and shape."""
    passed = check_contract(weight)
    contract = weight.contract
    for tensor, (dtype, shape) in _declared(weight).items():
        info = inventory.get(tensor)
        if info is None:
            raise PlaneMissingError(
                weight.name,
                f"plane {tensor}",
                "present",
                "absent",
                "the checkpoint lost a plane the contract reads",
            )
        if isinstance(contract, AffineIntContract | MicroscaleContract) and tensor == contract.scales.plane:
            _check_scale_format(weight.name, contract.scales, info.dtype)
            _check_scale_shape(weight.name, contract.scales, info.shape, *weight.shape.extents)
        if info.dtype != dtype or tuple(info.shape) != tuple(shape):
            raise PlaneShapeError(
                weight.name,
                f"{tensor} dtype/shape",
                f"{dtype} {list(shape)}",
                f"{info.dtype} {list(info.shape)}",
            )
    return (*passed, "inventory.planes")


def check_values(weight: LogicalWeight, planes: Planes) -> tuple[str, ...]:
    """Check plane contents; the planes must be present (see :func:`require_planes`)."""
    contract = weight.contract
    require_planes(weight, planes)
    if isinstance(contract, GgufBlockContract):
        scales = gguf_block_scales(
            contract.ggml_type,
            planes[contract.plane],
            weight.shape.rows,
            weight.shape.columns,
            contract.plane,
        )
        bad = ~np.isfinite(scales)
        if bad.any():
            raise ScaleValueError(
                weight.name,
                f"{contract.plane} block scales ({contract.ggml_type})",
                SCALE_RULES.get(contract.ggml_type, "finite d/dmin"),
                f"{int(bad.sum())} NaN/inf, the first in "
                + _block_at(int(np.flatnonzero(bad)[0]), scales.size, contract.ggml_type, weight.shape),
            )
        return ("values.block_scales",)
    if isinstance(contract, MicroscaleContract):
        return microscaling.check_mx_values(weight.name, contract, planes, weight.shape.columns)
    if not isinstance(contract, AffineIntContract):
        as_plane(planes[contract.plane], contract.physical_dtype, weight.shape.extents, contract.plane)
        return ("values.size",)
    n, k = weight.shape.extents
    plane_values.check_codes(weight.name, contract, planes, n, k)
    plane_values.check_scales(weight.name, contract.scales, planes)
    plane_values.check_zero_points(weight.name, contract, planes, n)
    plane_values.check_group_map(weight.name, contract, planes, k)
    plane_values.check_permutation(weight.name, contract, planes, k)
    return ("values.codes", "values.scales", "values.zero_point", "values.group_map", "values.permutation")


def _block_at(index: int, count: int, ggml_type: str, shape: LogicalShape) -> str:
    """Where block scale ``index`` of ``count`` lies: its block, row and flat element range."""
    size = BLOCK_SIZES[ggml_type][0]
    blocks = shape.rows * shape.columns // size
    grouped = ggml_type not in ("IQ1_M", "MXFP4", "NVFP4")  # every d, then every m (dmin)
    block = index % blocks if grouped else index * blocks // count
    per_row = shape.columns // size
    first = block * size
    return f"block {block} (row {block // per_row}, flat elements {first}..{first + size - 1})"


def require_planes(weight: LogicalWeight, planes: Planes) -> None:
    """Raise :class:`PlaneMissingError` for the first plane the contract reads that is absent."""
    for tensor in contract_planes(weight.contract):
        if tensor not in planes:
            raise PlaneMissingError(
                weight.name,
                f"plane {tensor}",
                "present",
                "absent",
                "the checkpoint lost a plane the contract reads",
            )


def run_gates(
    weight: LogicalWeight, planes: Planes, inventory: Mapping[str, TensorInfo] | None = None
) -> GateReport:
    """Run every gate that applies (inventory gates only when an inventory is given)."""
    passed = check_inventory(weight, inventory) if inventory is not None else check_contract(weight)
    return GateReport(weight=weight.name, passed=(*passed, *check_values(weight, planes)))
