"""Value gates: the contents of an integer contract's planes (codes, scales, zero points, g_idx, perm).

Each check reads one plane (typed or raw bytes) and raises its own error class; :func:`.gates.check_values`
runs them in order.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .encodings import encoding_value_range
from .errors import (
    CodeRangeError,
    GroupIndexError,
    ScaleSignError,
    ScaleValueError,
    ZeroPointRangeError,
)
from .formats import as_plane, scale_to_f32
from .model import (
    AffineIntContract,
    GroupMapIndex,
    MicroscaleContract,
    PermutationPlane,
    ScaleSpec,
    ZeroImplicit,
    ZeroIntPlane,
)
from .packing import apply_encoding, padding_fields, unpack_rows
from .permutation import read_permutation

Planes = Mapping[str, npt.NDArray[np.generic]]


def check_codes(weight: str, contract: AffineIntContract, planes: Planes, n: int, k: int) -> None:
    """Unpacked codes lie in the encoding's stored range; packed planes have all-zero padding bits."""
    codes = contract.codes
    plane = as_plane(planes[codes.plane], codes.physical_dtype, codes.physical_shape, codes.plane)
    if codes.packing.axis == "none":
        lo, hi = encoding_value_range(codes.encoding)
        if "_offset" in codes.encoding:
            lo, hi = 0, (1 << codes.bits) - 1
        values = plane.astype(np.int64)
        if values.size and (values.min() < lo or values.max() > hi):
            raise CodeRangeError(
                weight,
                f"{codes.plane} codes",
                f"stored values in [{lo}, {hi}] ({codes.encoding})",
                f"[{values.min()}, {values.max()}]",
            )
        return
    pad = padding_fields(plane, codes.physical_axes, codes.bits, codes.packing, {"N": n, "K": k})
    if pad.size and pad.any():
        raise CodeRangeError(
            weight,
            f"{codes.plane} padding bits",
            "all zero (tail zero_fill)",
            f"{int(pad.sum())} set bits",
            "the tail of the last container is not padding",
        )


def check_scales(weight: str, scales: ScaleSpec, planes: Planes) -> None:
    """Scales are finite and, in the ``positive`` sign domain, carry no sign bit."""
    plane = as_plane(planes[scales.plane], scales.physical_dtype, scales.physical_shape, scales.plane)
    values = scale_to_f32(plane, scales.format, scales.plane)
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ScaleValueError(
            weight,
            f"{scales.plane} values",
            "finite scales",
            f"{int(bad.sum())} NaN/inf, the first at flat index {first}",
        )
    negative = np.signbit(values)
    if scales.sign == "positive" and negative.any():
        raise ScaleSignError(
            weight,
            f"{scales.plane} scales.sign",
            "positive (no sign bit set)",
            f"{int(negative.sum())} negative scales (min {values.min()!r})",
            "the producer stores signed scales; declare sign: signed",
        )


def check_zero_points(weight: str, contract: AffineIntContract, planes: Planes, n: int) -> None:
    """Effective zero points (after the convention) lie in the codes' value range."""
    zero = contract.zero_point
    lo, hi = encoding_value_range(contract.codes.encoding)
    if isinstance(zero, ZeroImplicit):
        values = np.array([zero.value], dtype=np.int64)
    elif isinstance(zero, ZeroIntPlane):
        plane = as_plane(planes[zero.plane], zero.physical_dtype, zero.physical_shape, zero.plane)
        raw = unpack_rows(
            plane,
            zero.physical_axes,
            zero.bits,
            zero.packing,
            {"N": n, "G": contract.scales.group_count},
            None,
        )
        values = apply_encoding(raw, zero.encoding, zero.bits, packed=zero.packing.axis != "none")
        values = values + 1 if zero.convention == "minus_one" else values
    else:
        return
    if values.size and (values.min() < lo or values.max() > hi):
        raise ZeroPointRangeError(
            weight,
            "zero_point",
            f"effective zero points in [{lo}, {hi}] (codes {contract.codes.encoding})",
            f"[{values.min()}, {values.max()}]",
            "check the zero-point convention (as_is vs minus_one); GPTQ v1 wraps a zero of 0 to 16",
        )


def check_group_map(weight: str, contract: AffineIntContract, planes: Planes, k: int) -> None:
    """g_idx values are groups that exist, each group owns G columns, and ``sequential`` means ``k // G``."""
    group_map = contract.group_map
    if not isinstance(group_map, GroupMapIndex):
        return
    scales = contract.scales
    g_idx = (
        as_plane(planes[group_map.plane], group_map.physical_dtype, group_map.physical_shape, group_map.plane)
        .reshape(-1)
        .astype(np.int64)
    )
    if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= scales.group_count):
        raise GroupIndexError(
            weight,
            f"{group_map.plane} values",
            f"in [0, {scales.group_count})",
            f"[{g_idx.min()}, {g_idx.max()}]",
        )
    sequential = np.arange(k, dtype=np.int64) // scales.group_size
    if group_map.sequential and not np.array_equal(g_idx, sequential):
        first = int(np.flatnonzero(g_idx != sequential)[0])
        raise GroupIndexError(
            weight,
            f"{group_map.plane}[{first}]",
            f"{sequential[first]} (sequential, k // G)",
            int(g_idx[first]),
            "the checkpoint uses act-order; declare sequential: false",
        )
    sizes = np.bincount(g_idx, minlength=scales.group_count)
    expected = np.bincount(sequential, minlength=scales.group_count)
    if not np.array_equal(sizes, expected):
        group = int(np.flatnonzero(sizes != expected)[0])
        raise GroupIndexError(
            weight,
            f"{group_map.plane} members of group {group}",
            int(expected[group]),
            int(sizes[group]),
            "each group must own exactly G columns (the tail group fewer)",
        )


def check_permutation(
    weight: str, contract: AffineIntContract | MicroscaleContract, planes: Planes, k: int
) -> None:
    """A permutation plane is a bijection of range(K)."""
    perm = contract.permutation
    if isinstance(perm, PermutationPlane):
        read_permutation(weight, perm, planes, k)
