"""Reference decoders: explicit, slow and exact; the oracle every kernel is compared against.

Every decoder takes the planes (numpy arrays keyed by tensor name, either typed or as raw bytes) and the
contract, and returns binary32. With ``rows=None`` the result has the logical shape; with ``rows`` (N
indices — for ``[E, N, K]`` weights, indices of the flattened ``E·N`` rows; for vectors, element indices)
it is ``[len(rows), K]`` (``[len(rows), 1]`` for vectors).

Decode laws (closed set, fixed evaluation order):

- ``float_upcast``: widen the stored float to binary32 (exact).
- ``affine_f32``: ``y = f32(q - z) * f32(s)`` — the integer difference is formed exactly, converted,
  and multiplied once in binary32. For codes of ≤ 8 bits and 16-bit scales the product is exact, so
  any kernel that forms it exactly must agree bit for bit. (GPTQ, AWQ.)
- ``affine_round_to_scale_format``: ``y = round_fmt(f32(q - z) * f32(s))`` with ``fmt`` the scale
  format (round to nearest even), i.e. evaluation in the scale's dtype — compressed-tensors'
  decompressor.
- ``ggml_block``: defined per ggml type in :mod:`.gguf_blocks`.

- ``mx_f32`` / ``mx_round_bf16``: FP4 block formats, in :mod:`.microscaling`.

Where the codes' group is ``g(k) = k // G``, or ``g_idx[k]`` under a g_idx group map, over stored
columns; a permutation plane then puts the columns in logical order in its declared direction
(:mod:`.permutation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .errors import (
    GroupIndexError,
    PlaneMissingError,
    UnsupportedContractError,
)
from .formats import as_plane, round_to_format, scale_to_f32
from .gates import check_contract_shape
from .gguf_blocks import decode_gguf_rows
from .microscaling import E2M1, block_scales
from .model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    GlobalScalePlane,
    GroupMapIndex,
    LogicalShape,
    LogicalWeight,
    MicroscaleContract,
    PermutationPlane,
    ZeroFloatPlane,
    ZeroImplicit,
    ZeroIntPlane,
)
from .packing import apply_encoding, unpack_rows
from .permutation import read_permutation, to_logical

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
Planes = Mapping[str, npt.NDArray[np.generic]]


def plane_array(planes: Planes, tensor: str, weight: str) -> npt.NDArray[np.generic]:
    """Return the named plane, or raise :class:`PlaneMissingError` (a dropped plane)."""
    if tensor not in planes:
        raise PlaneMissingError(
            weight,
            f"plane {tensor}",
            "present",
            "absent",
            "the checkpoint lost a plane the contract reads; re-fetch it or fix the contract",
        )
    return planes[tensor]


def _row_indices(rows: Sequence[int] | None, total: int, weight: str) -> I64 | None:
    if rows is None:
        return None
    index = np.asarray(list(rows), dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= total):
        raise UnsupportedContractError(weight, "rows", f"indices in [0, {total})", index.tolist())
    return index


def decode_float(
    contract: FloatContract,
    planes: Planes,
    shape: LogicalShape,
    rows: Sequence[int] | None = None,
    weight: str = "<weight>",
) -> F32:
    """Decode a float plane (F32/F16/BF16) to binary32."""
    plane = as_plane(
        plane_array(planes, contract.plane, weight), contract.physical_dtype, shape.extents, contract.plane
    )
    values = scale_to_f32(plane, contract.format, contract.plane).reshape(shape.rows, shape.columns)
    index = _row_indices(rows, shape.rows, weight)
    if index is None:
        return values.reshape(shape.extents)
    return values[index]


def decode_gguf(
    contract: GgufBlockContract,
    planes: Planes,
    shape: LogicalShape,
    rows: Sequence[int] | None = None,
    weight: str = "<weight>",
) -> F32:
    """Decode a GGUF tensor of the contract's ggml type to binary32."""
    data = plane_array(planes, contract.plane, weight)
    index = _row_indices(rows, shape.rows, weight)
    values = decode_gguf_rows(contract.ggml_type, data, shape.rows, shape.columns, contract.plane, index)
    return values.reshape(shape.extents) if index is None else values


def _stored_codes(
    contract: AffineIntContract | MicroscaleContract,
    planes: Planes,
    shape: LogicalShape,
    index: I64 | None,
    weight: str,
) -> npt.NDArray[np.int64]:
    """The stored codes of rows ``index`` (all when None), unpacked from the code plane, as ``[rows, K]``."""
    n, k = shape.extents
    codes = contract.codes
    code_plane = as_plane(
        plane_array(planes, codes.plane, weight), codes.physical_dtype, codes.physical_shape, codes.plane
    )
    return unpack_rows(code_plane, codes.physical_axes, codes.bits, codes.packing, {"N": n, "K": k}, index)


def decode_mx(
    contract: MicroscaleContract,
    planes: Planes,
    shape: LogicalShape,
    rows: Sequence[int] | None = None,
    weight: str = "<weight>",
) -> F32:
    """Decode FP4 codes with block scales (MXFP4, NVFP4): ``y = e2m1(q) · s`` in binary32 (law rounding)."""
    check_contract_shape(weight, contract, shape)
    n, k = shape.extents
    index = _row_indices(rows, n, weight)
    q = _stored_codes(contract, planes, shape, index, weight)
    glob = contract.global_scale
    scale = block_scales(
        weight,
        contract,
        plane_array(planes, contract.scales.plane, weight),
        plane_array(planes, glob.plane, weight) if isinstance(glob, GlobalScalePlane) else None,
        index,
    )
    with np.errstate(over="ignore"):  # 6 · 2^127 is +inf, in compressed-tensors' decode too
        values = E2M1[q] * scale[:, np.arange(k, dtype=np.int64) // contract.scales.group_size]
    if contract.decode_law == "mx_round_bf16":
        values = round_to_format(values, "bfloat16")
    if isinstance(contract.permutation, PermutationPlane):
        values = to_logical(
            values, read_permutation(weight, contract.permutation, planes, k), contract.permutation.direction
        )
    return values.astype(np.float32, copy=False)


def _group_of_columns(contract: AffineIntContract, planes: Planes, k: int, weight: str) -> I64:
    """Return the group index of every stored column."""
    group_map = contract.group_map
    if isinstance(group_map, GroupMapIndex):
        raw = as_plane(
            plane_array(planes, group_map.plane, weight),
            group_map.physical_dtype,
            group_map.physical_shape,
            group_map.plane,
        )
        group = raw.reshape(-1).astype(np.int64)
        if group.size and (group.min() < 0 or group.max() >= contract.scales.group_count):
            raise GroupIndexError(
                weight,
                f"{group_map.plane} values",
                f"in [0, {contract.scales.group_count})",
                f"[{group.min()}, {group.max()}]",
            )
        return group
    return np.arange(k, dtype=np.int64) // contract.scales.group_size


def _zero_points(
    contract: AffineIntContract, planes: Planes, n: int, index: I64 | None, weight: str
) -> F32 | I64:
    """Return effective zero points oriented ``[rows, G]`` (integers, or floats for a float plane)."""
    zero = contract.zero_point
    groups = contract.scales.group_count
    count = n if index is None else index.size
    if isinstance(zero, ZeroImplicit):
        return np.full((count, groups), zero.value, dtype=np.int64)
    if isinstance(zero, ZeroIntPlane):
        plane = as_plane(
            plane_array(planes, zero.plane, weight), zero.physical_dtype, zero.physical_shape, zero.plane
        )
        stored = unpack_rows(plane, zero.physical_axes, zero.bits, zero.packing, {"N": n, "G": groups}, index)
        value = apply_encoding(stored, zero.encoding, zero.bits, packed=zero.packing.axis != "none")
        return value + 1 if zero.convention == "minus_one" else value
    if isinstance(zero, ZeroFloatPlane):
        plane = as_plane(
            plane_array(planes, zero.plane, weight), zero.physical_dtype, zero.physical_shape, zero.plane
        )
        oriented = plane if zero.physical_axes[0] == "N" else plane.T
        values = scale_to_f32(np.ascontiguousarray(oriented), zero.format, zero.plane)
        return values if index is None else values[index]
    return np.zeros((count, groups), dtype=np.int64)


@dataclass(frozen=True)
class AffineTerms:
    """The parts of an affine decode, in stored column order (see :func:`affine_terms`).

    ``q``: the codes' integer values ``[rows, K]``; ``zero``: zero points ``[rows, G]`` (integer, or float
    for a float zero plane); ``scale``: binary32 scales ``[rows, G]``; ``group``: each stored column's
    group ``[K]``; ``columns``: the permutation plane's values (read in its declared direction by
    :func:`.permutation.to_logical`), or None.
    """

    q: I64
    zero: F32 | I64
    scale: F32
    group: I64
    columns: I64 | None


def _affine_extents(contract: AffineIntContract, shape: LogicalShape, weight: str) -> tuple[int, int]:
    """``(N, K)`` of an affine weight whose scales are one level of groups along K (else refused)."""
    scales = contract.scales
    if scales.group_axis != "K" or scales.levels != 1:
        raise UnsupportedContractError(
            weight, "scales", "one level of groups along K", (scales.group_axis, scales.levels)
        )
    check_contract_shape(weight, contract, shape)
    n, k = shape.extents
    return n, k


def affine_terms(
    contract: AffineIntContract,
    planes: Planes,
    shape: LogicalShape,
    rows: Sequence[int] | None = None,
    weight: str = "<weight>",
) -> AffineTerms:
    """Unpack the codes, zero points and scales of ``rows`` (all rows when None), element by element."""
    n, k = _affine_extents(contract, shape, weight)
    index = _row_indices(rows, n, weight)
    codes = contract.codes
    stored = _stored_codes(contract, planes, shape, index, weight)
    q = apply_encoding(stored, codes.encoding, codes.bits, packed=codes.packing.axis != "none")

    z, s, group = _qparams(contract, planes, n, k, index, weight)
    columns: I64 | None = None
    if isinstance(contract.permutation, PermutationPlane):
        columns = read_permutation(weight, contract.permutation, planes, k)
    return AffineTerms(q=q, zero=z, scale=s, group=group, columns=columns)


def _qparams(
    contract: AffineIntContract, planes: Planes, n: int, k: int, index: I64 | None, weight: str
) -> tuple[F32 | I64, F32, I64]:
    scales = contract.scales
    scale_plane = as_plane(
        plane_array(planes, scales.plane, weight), scales.physical_dtype, scales.physical_shape, scales.plane
    )
    oriented = scale_plane if scales.physical_axes[0] == "N" else scale_plane.T
    s = scale_to_f32(np.ascontiguousarray(oriented), scales.format, scales.plane)
    s = s if index is None else s[index]
    z = _zero_points(contract, planes, n, index, weight)
    return z, s, _group_of_columns(contract, planes, k, weight)


def affine_qparams(
    contract: AffineIntContract, planes: Planes, shape: LogicalShape, weight: str = "<weight>"
) -> tuple[F32 | I64, F32, I64]:
    """:func:`affine_terms` without the codes: (zero points, binary32 scales, each stored column's group).

    For a kernel that unpacks the codes itself (and pays for no ``[N, K]`` int64 array); the same
    contract and plane checks, the same zero-point and scale law.
    """
    n, k = _affine_extents(contract, shape, weight)
    return _qparams(contract, planes, n, k, None, weight)


def decode_affine(
    contract: AffineIntContract,
    planes: Planes,
    shape: LogicalShape,
    rows: Sequence[int] | None = None,
    weight: str = "<weight>",
) -> F32:
    """Decode integer codes with grouped scales and zero points (GPTQ, AWQ, compressed-tensors)."""
    terms = affine_terms(contract, planes, shape, rows, weight)
    group = terms.group
    if terms.zero.dtype == np.int64:
        diff = (terms.q - terms.zero[:, group]).astype(np.float32)
    else:
        diff = terms.q.astype(np.float32) - terms.zero[:, group].astype(np.float32)
    values = diff * terms.scale[:, group]
    if contract.decode_law == "affine_round_to_scale_format":
        values = round_to_format(values, contract.scales.format)
    if terms.columns is not None and isinstance(contract.permutation, PermutationPlane):
        values = to_logical(values, terms.columns, contract.permutation.direction)
    return values.astype(np.float32, copy=False)


def decode_weight(weight: LogicalWeight, planes: Planes, rows: Sequence[int] | None = None) -> F32:
    """Decode a logical weight (all of it, or only ``rows``) with the reference decoder of its family."""
    contract = weight.contract
    if isinstance(contract, FloatContract):
        return decode_float(contract, planes, weight.shape, rows, weight.name)
    if isinstance(contract, GgufBlockContract):
        return decode_gguf(contract, planes, weight.shape, rows, weight.name)
    if isinstance(contract, MicroscaleContract):
        return decode_mx(contract, planes, weight.shape, rows, weight.name)
    return decode_affine(contract, planes, weight.shape, rows, weight.name)
