"""How far an honest decode may be from the float weights it quantizes: a bound per element.

A round-to-nearest quantizer picks, for each element, the code whose level is nearest the float
weight, so an honest decode is within half a quantization step of it — the step being the element's
own scale (``s`` for ``s·(q - z)``; ``d·sc`` of its sub-block for GGUF K-quants). Two things widen
that, both derived from the stored scales too:

- the scale is rounded to its storage format after the codes were chosen: ``2·eps_fmt·|level|·step``
  (and ``2·eps_fmt·|offset|`` for an additive minimum ``m``/``dmin·m``), ``eps_fmt`` the format's unit
  roundoff (2^-11 binary16, 2^-8 bfloat16, 2^-4 e4m3);
- clipping: a code at the edge of its range (0 or 2^b - 1, or the signed ends) stands for every float
  beyond that edge, so the error *outward* from an edge code is not bounded.

Float planes (GGUF F16/BF16) are bounded by the format's half ulp. Nothing depends on the weight's
name or on one number per bit width: :func:`check_against` compares every element it is given.
Quantizers that move codes off the nearest level on purpose (GPTQ's error feedback) can exceed half
a step against the original weights; they are checked against their own dequantized values instead
(``push --witness``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .decode import affine_terms, decode_weight, plane_array
from .encodings import encoding_value_range
from .errors import ReferenceErrorTooLargeError, UnsupportedContractError
from .formats import as_plane, round_to_format
from .gguf_blocks import BLOCK_SIZES, _fifth_bits, _half, _nibbles32, _scale_min_k4, as_gguf_rows
from .gguf_terms import GRID_TYPES, SCALE_EPS, lowbit_terms
from .microscaling import E2M1, block_scales
from .model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    GlobalScalePlane,
    LogicalWeight,
    MicroscaleContract,
    PermutationPlane,
)
from .packing import unpack_rows
from .permutation import read_permutation, to_logical

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Planes = Mapping[str, npt.NDArray[np.generic]]

#: Unit roundoff of each scale/float storage format.
FORMAT_EPS = {
    "binary32": 2.0**-24,
    "binary16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "e8m0": 2.0**-24,
    "e4m3": 2.0**-4,
}
_GGUF_EPS = {"F32": 2.0**-24, "F16": 2.0**-11, "BF16": 2.0**-8}
#: Slack for binary32 evaluation of the decode itself, relative to the value.
_ARITH = 2.0**-21
#: Elements compared per chunk (bounded memory for any weight).
CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class Bounds:
    """For ``rows``: the decode, the allowed error per element, the signed step, the edge codes.

    ``outward_low``/``outward_high``: the element's code is the lowest/highest of its range (a float
    below/above the decoded value is a clipped one). ``unit``: the group or block each column is in.
    """

    decoded: F32
    bound: F64
    step: F64
    low_edge: npt.NDArray[np.bool_]
    high_edge: npt.NDArray[np.bool_]
    unit: int


def _affine_bounds(
    weight: LogicalWeight, contract: AffineIntContract, planes: Planes, rows: Sequence[int]
) -> Bounds:
    terms = affine_terms(contract, planes, weight.shape, rows, weight.name)
    group = terms.group
    if terms.zero.dtype == np.int64:
        level32 = (terms.q - terms.zero[:, group]).astype(np.float32)
    else:
        level32 = terms.q.astype(np.float32) - terms.zero[:, group].astype(np.float32)
    scale = terms.scale[:, group]
    decoded = level32 * scale
    eps = FORMAT_EPS[contract.scales.format]
    step = scale.astype(np.float64)
    bound = np.abs(step) * (0.5 + 2 * eps * np.abs(level32.astype(np.float64)))
    if contract.decode_law == "affine_round_to_scale_format":
        decoded = round_to_format(decoded, contract.scales.format)
        bound = bound + eps * np.abs(decoded.astype(np.float64))
    low, high = encoding_value_range(contract.codes.encoding)
    b = Bounds(
        decoded.astype(np.float32, copy=False),
        bound,
        step,
        terms.q == low,
        terms.q == high,
        contract.scales.group_size,
    )
    if terms.columns is not None and isinstance(contract.permutation, PermutationPlane):
        return _in_logical_order(b, terms.columns, contract.permutation.direction, decoded=True)
    return b


def _in_logical_order(b: Bounds, order: npt.NDArray[np.int64], direction: str, *, decoded: bool) -> Bounds:
    """``b``'s stored-order columns in logical order, as the decoder puts them (:func:`.to_logical`).

    ``decoded``: whether ``b.decoded`` is in stored order too (else the decoder made it, logical).
    """
    return Bounds(
        to_logical(b.decoded, order, direction) if decoded else b.decoded,
        to_logical(b.bound, order, direction),
        to_logical(b.step, order, direction),
        to_logical(b.low_edge, order, direction),
        to_logical(b.high_edge, order, direction),
        b.unit,
    )


#: Half the larger gap beside each E2M1 code's level (|level| 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign bit 3).
_E2M1_HALF_GAP = np.array([0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0] * 2)


def _mx_bounds(
    weight: LogicalWeight, contract: MicroscaleContract, planes: Planes, rows: Sequence[int]
) -> Bounds:
    """FP4 levels are not evenly spaced: an element's step is the larger gap beside its level."""
    n, k = weight.shape.extents
    index = np.asarray(list(rows), dtype=np.int64)
    codes, glob = contract.codes, contract.global_scale
    plane = as_plane(
        plane_array(planes, codes.plane, weight.name), codes.physical_dtype, codes.physical_shape, codes.plane
    )
    q = unpack_rows(plane, codes.physical_axes, 4, codes.packing, {"N": n, "K": k}, index)
    scales = block_scales(
        weight.name,
        contract,
        plane_array(planes, contract.scales.plane, weight.name),
        plane_array(planes, glob.plane, weight.name) if isinstance(glob, GlobalScalePlane) else None,
        index,
    )
    step = scales[:, np.arange(k) // contract.scales.group_size].astype(np.float64)
    level = np.abs(E2M1[q].astype(np.float64))
    eps = FORMAT_EPS[contract.scales.format]
    bound = np.abs(step) * (_E2M1_HALF_GAP[q] + 2 * eps * level)
    decoded = decode_weight(weight, planes, rows)
    if contract.decode_law == "mx_round_bf16":
        bound = bound + FORMAT_EPS["bfloat16"] * np.abs(decoded.astype(np.float64))
    b = Bounds(decoded, bound, step, q == 0xF, q == 0x7, contract.scales.group_size)  # -6, +6: the ends
    if isinstance(contract.permutation, PermutationPlane):
        order = read_permutation(weight.name, contract.permutation, planes, k)
        return _in_logical_order(b, order, contract.permutation.direction, decoded=False)
    return b


def _gguf_terms(
    ggml_type: str, blocks: npt.NDArray[np.uint8]
) -> tuple[F64, F64, F64, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Per element of ``[B, block]``: step, level, additive offset, lowest and highest code."""
    count = blocks.shape[0]
    if ggml_type == "Q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.int64)
        return _wide(_half(blocks, 0), q), q.astype(np.float64), np.zeros(q.shape), q == -128, q == 127
    if ggml_type in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        five = ggml_type.startswith("Q5")
        minimum = ggml_type.endswith("_1")
        nib_at = (8 if minimum else 6) if five else (4 if minimum else 2)
        q = _nibbles32(blocks[:, nib_at : nib_at + 16])
        if five:
            q = q | (_fifth_bits(blocks, 4 if minimum else 2) << 4)
        top = 31 if five else 15
        level = q if minimum else q - (top + 1) // 2
        offset = _wide(_half(blocks, 2), q) if minimum else np.zeros(q.shape)
        return _wide(_half(blocks, 0), q), level.astype(np.float64), offset, q == 0, q == top
    if ggml_type in ("Q4_K", "Q5_K"):
        scale, mins = _scale_min_k4(blocks[:, 4:16])
        nib_at = 48 if ggml_type == "Q5_K" else 16
        qs = blocks[:, nib_at : nib_at + 128].reshape(count, 4, 1, 32).astype(np.int64)
        q = ((qs >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0x0F).reshape(count, 8, 32)
        if ggml_type == "Q5_K":
            qh = blocks[:, 16:48].astype(np.int64).reshape(count, 1, 32)
            q = q | (((qh >> np.arange(8).reshape(1, 8, 1)) & 1) << 4)
        top = 31 if ggml_type == "Q5_K" else 15
        step = (_half(blocks, 0).astype(np.float64) * scale).reshape(count, 8, 1) * np.ones((1, 1, 32))
        offset = (_half(blocks, 2).astype(np.float64) * mins).reshape(count, 8, 1) * np.ones((1, 1, 32))
        flat = (count, 256)
        return (
            step.reshape(flat),
            q.reshape(flat).astype(np.float64),
            offset.reshape(flat),
            (q == 0).reshape(flat),
            (q == top).reshape(flat),
        )
    if ggml_type == "Q6_K":
        ql6 = blocks[:, 0:128].astype(np.int64).reshape(count, 2, 2, 32)
        qh6 = blocks[:, 128:192].astype(np.int64).reshape(count, 2, 1, 32)
        low = np.concatenate([ql6 & 0x0F, ql6 >> 4], axis=2)
        high = (qh6 >> (2 * np.arange(4).reshape(1, 1, 4, 1))) & 3
        q6 = (low | (high << 4)).reshape(count, 16, 16)
        sub = blocks[:, 192:208].view(np.int8).astype(np.float64)
        step = (_half(blocks, 208).astype(np.float64) * sub).reshape(count, 16, 1) * np.ones((1, 1, 16))
        flat = (count, 256)
        return (
            step.reshape(flat),
            (q6 - 32).reshape(flat).astype(np.float64),
            np.zeros(flat),
            (q6 == 0).reshape(flat),
            (q6 == 63).reshape(flat),
        )
    more = lowbit_terms(ggml_type, blocks)
    if more is not None:
        return more
    zeros = np.zeros((count, BLOCK_SIZES[ggml_type][0]))  # float types, and the grid types: exact only
    none = np.zeros(zeros.shape, dtype=bool)
    return zeros, zeros, zeros, none, none


def _wide(column: F32, like: npt.NDArray[np.int64]) -> F64:
    return np.broadcast_to(column.astype(np.float64), like.shape).copy()


def _gguf_bounds(
    weight: LogicalWeight, contract: GgufBlockContract, planes: Planes, rows: Sequence[int]
) -> Bounds:
    shape = weight.shape
    decoded = decode_weight(weight, planes, rows)
    data = plane_array(planes, contract.plane, weight.name)
    table = as_gguf_rows(data, contract.ggml_type, shape.rows, shape.columns, contract.plane)
    block, size = BLOCK_SIZES[contract.ggml_type]
    blocks = np.ascontiguousarray(table[np.asarray(list(rows), dtype=np.int64)]).reshape(-1, size)
    step, level, offset, low, high = _gguf_terms(contract.ggml_type, blocks)
    as_rows = (len(rows), shape.columns)
    step, level, offset = step.reshape(as_rows), level.reshape(as_rows), offset.reshape(as_rows)
    if contract.ggml_type in _GGUF_EPS:
        eps = _GGUF_EPS[contract.ggml_type]
        bound = eps * np.abs(decoded.astype(np.float64)) + 2.0**-25
    else:
        eps = SCALE_EPS.get(contract.ggml_type, FORMAT_EPS["binary16"])
        bound = np.abs(step) * (0.5 + 2 * eps * np.abs(level)) + 2 * eps * np.abs(offset)
    return Bounds(decoded, bound, step, low.reshape(as_rows), high.reshape(as_rows), block)


def bounds_of(weight: LogicalWeight, planes: Planes, rows: Sequence[int]) -> Bounds:
    """The decode of ``rows`` (flattened row indices) with the honest rounding bound of each element."""
    contract = weight.contract
    if isinstance(contract, AffineIntContract):
        return _affine_bounds(weight, contract, planes, rows)
    if isinstance(contract, GgufBlockContract):
        return _gguf_bounds(weight, contract, planes, rows)
    if isinstance(contract, MicroscaleContract):
        return _mx_bounds(weight, contract, planes, rows)
    decoded = decode_weight(weight, planes, rows)
    assert isinstance(contract, FloatContract)
    bound = FORMAT_EPS[contract.format] * np.abs(decoded.astype(np.float64)) + 2.0**-25
    none = np.zeros(decoded.shape, dtype=bool)
    return Bounds(decoded, bound, np.zeros(decoded.shape), none, none, 1)


def violations(b: Bounds, values: F32) -> npt.NDArray[np.bool_]:
    """Elements of ``values`` (the float weights of the same rows) outside the honest bound."""
    diff = values.astype(np.float64) - b.decoded.astype(np.float64)
    slack = b.bound + _ARITH * np.abs(b.decoded.astype(np.float64))
    outside = ~(np.abs(diff) <= slack)  # NaN anywhere is outside
    sign = np.sign(b.step)
    clipped = (b.low_edge & (diff * sign < 0)) | (b.high_edge & (diff * sign > 0))
    return outside & ~(clipped & np.isfinite(diff))


def _where(weight: LogicalWeight, row: int) -> str:
    if weight.shape.axes[0] == "E":
        n = weight.shape.extents[1]
        return f"expert {row // n} row {row % n}"
    return f"row {row}"


def checked_bounds(
    weight: LogicalWeight,
    planes: Planes,
    rows: Sequence[int],
    values: F32,
    *,
    what: str,
    columns: tuple[int, int] | None = None,
) -> Bounds:
    """The bounds of ``rows`` (their ``columns`` range of K), after checking ``values`` lies within them.

    Raises :class:`ReferenceErrorTooLargeError` naming the weight, row, column, group/block, error and
    bound of the first element of ``values`` (``[len(rows), K]`` or the range) outside its bound.
    """
    b = bounds_of(weight, planes, rows)
    c0 = 0
    if columns is not None:
        c0, c1 = columns
        b = Bounds(
            b.decoded[:, c0:c1],
            b.bound[:, c0:c1],
            b.step[:, c0:c1],
            b.low_edge[:, c0:c1],
            b.high_edge[:, c0:c1],
            b.unit,
        )
    bad = violations(b, values)
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        err = float(values[i, j]) - float(b.decoded[i, j])
        column = c0 + j
        raise ReferenceErrorTooLargeError(
            weight.name,
            f"{_where(weight, int(rows[i]))} column {column} (group/block {column // b.unit}) vs {what}",
            f"|decoded - {what}| <= {float(b.bound[i, j]):.6g} (half the quantization step "
            f"{abs(float(b.step[i, j])):.6g} plus scale rounding)",
            f"{abs(err):.6g} (decoded {float(b.decoded[i, j])!r}, {what} {float(values[i, j])!r}); "
            f"{int(bad.sum())} of {bad.size} elements compared are outside",
            "the decode does not reproduce the weights; check the scale axis, zero-point convention, "
            "slot order and scale format of the contract",
        )
    return b


def check_against(
    weight: LogicalWeight,
    planes: Planes,
    rows: Sequence[int],
    values: F32,
    *,
    what: str,
    columns: tuple[int, int] | None = None,
) -> tuple[float, float, bool]:
    """Compare ``values`` (``[len(rows), K]``, or the ``columns`` range of K) with the decode of ``rows``.

    Returns ``(sum of squared differences, sum of squared values, bit-equal)``. Raises as
    :func:`checked_bounds` does.
    """
    b = checked_bounds(weight, planes, rows, values, what=what, columns=columns)
    diff = values.astype(np.float64) - b.decoded.astype(np.float64)
    exact = bool(np.array_equal(values.view(np.uint32), np.ascontiguousarray(b.decoded).view(np.uint32)))
    return float(np.sum(diff * diff)), float(np.sum(values.astype(np.float64) ** 2)), exact


@dataclass(frozen=True)
class ReferenceSums:
    """A decode against its float reference, summed over every row (float64).

    ``err2``/``norm2``/``bound2``: sums of squared differences, reference values and element bounds;
    ``max_abs``: the largest ``|decoded - reference|``; ``clipped``: elements beyond their bound on the
    clipped side of an edge code (allowed by the gate, not by the bound). ``y_err2``/``y_norm2``: for
    activations ``X``, ``‖X·(W_q - W_fp)^T‖²`` and ``‖X·W_fp^T‖²`` (0 without activations).
    """

    err2: float
    norm2: float
    bound2: float
    max_abs: float
    clipped: int
    y_err2: float
    y_norm2: float

    @property
    def rel_frobenius(self) -> float:
        """``‖W_q - W_fp‖ / ‖W_fp‖`` (the absolute error when the reference is all zeros)."""
        return float(np.sqrt(self.err2 / self.norm2)) if self.norm2 > 0 else float(np.sqrt(self.err2))


def reference_sums(
    weight: LogicalWeight, planes: Planes, reference: F32, activations: F64 | None = None
) -> ReferenceSums:
    """Gate every row of the decode against the float ``reference`` (logical shape) and sum the errors.

    Each element must lie within its honest rounding bound (module docstring). Rows are compared in
    chunks of at most :data:`CHUNK_ELEMENTS` elements; ``activations`` (``[T, K]``) also sum the
    operator error of each chunk's rows.
    """
    contract = weight.contract
    if isinstance(contract, GgufBlockContract) and contract.ggml_type in GRID_TYPES:
        raise UnsupportedContractError(
            weight.name,
            "--reference",
            "a type with an element-wise rounding bound",
            f"ggml {contract.ggml_type}, a grid (vector) codebook: elements are rounded together",
            "push without --reference, or with --witness (the producer's own decode, compared exactly)",
        )
    total_rows, k = weight.shape.rows, weight.shape.columns
    table = np.asarray(reference, dtype=np.float32).reshape(total_rows, k)
    step = max(1, CHUNK_ELEMENTS // k)
    err2 = norm2 = bound2 = max_abs = y_err2 = y_norm2 = 0.0
    clipped = 0
    for start in range(0, total_rows, step):
        rows = list(range(start, min(total_rows, start + step)))
        values = table[start : start + len(rows)]
        b = checked_bounds(weight, planes, rows, values, what="reference")
        ref, decoded = values.astype(np.float64), b.decoded.astype(np.float64)
        diff = decoded - ref
        err2 += float(np.sum(diff * diff))
        norm2 += float(np.sum(ref * ref))
        bound2 += float(np.sum(b.bound * b.bound))
        max_abs = max(max_abs, float(np.max(np.abs(diff), initial=0.0)))
        clipped += int(np.count_nonzero(np.abs(diff) > b.bound + _ARITH * np.abs(decoded)))
        if activations is not None:
            y_err2 += float(np.sum((diff @ activations.T) ** 2))
            y_norm2 += float(np.sum((ref @ activations.T) ** 2))
    return ReferenceSums(err2, norm2, bound2, max_abs, clipped, y_err2, y_norm2)


def reference_gate(weight: LogicalWeight, planes: Planes, reference: F32) -> float:
    """Compare every row of the decode with the float ``reference`` (logical shape); return the error.

    Each element must lie within its honest rounding bound (module docstring); returns the Frobenius
    relative error (:func:`reference_sums`).
    """
    return reference_sums(weight, planes, reference).rel_frobenius
