"""MXFP4 and NVFP4: FP4 (E2M1) codes with one narrow scale per block of K (:class:`.MicroscaleContract`).

- MXFP4 (OCP MX): E2M1 codes, one E8M0 scale (a power of two, ``2^(e-127)``; 0xFF is NaN) per 32
  elements along K, no per-tensor scale.
- NVFP4: E2M1 codes, one E4M3 scale per 16 elements along K, and a per-tensor binary32 global scale
  applied to every block scale in binary32 (compressed-tensors divides by ``weight_global_scale``).

compressed-tensors (``mxfp4-pack-quantized`` / ``nvfp4-pack-quantized``) stores ``weight_packed`` U8
``[N, K/2]`` (two codes per byte, the lower K index in the low nibble), ``weight_scale`` ``[N, K/G]``
(U8 exponents for MXFP4, F8_E4M3 for NVFP4) and, for NVFP4, ``weight_global_scale`` F32 ``[1]``. Its
decompressor evaluates ``bf16(f32(e2m1(q)) · f32(s))`` (``s`` in binary32: ``f32(e4m3) / g``, or the
power of two): decode law ``mx_round_bf16``. For MXFP4 the product is exact in bfloat16, so the
rounding changes nothing; for NVFP4 it does.

Every 4-bit pattern is an E2M1 value (``0b1000`` is -0), and K is a whole number of blocks (both
formats' block sizes are even), so the codes have no range or padding to gate: the code gates are the
plane's shape and byte count. The scale gates are the format (dtype), the group count, finite and
positive values, and for NVFP4 one positive finite global scale.

This module holds the producer template, the gates and the scale/element arithmetic of the decoder
(:func:`.decode.decode_mx` reads the planes). It reads :mod:`.gates` helpers through the module so that
the two can import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from . import gates, plane_values
from .encodings import E2M1_VALUES
from .errors import (
    GlobalScaleError,
    PlaneShapeError,
    ScaleFormatError,
    ScaleShapeError,
    TailGroupError,
    UnsupportedContractError,
    schema_error,
)
from .formats import as_plane, scale_to_f32
from .model import (
    CodesSpec,
    GlobalScaleNone,
    GlobalScalePlane,
    Label,
    LogicalShape,
    MicroscaleContract,
    Packing,
    PermutationNone,
    PermutationPlane,
    ScaleSpec,
    TensorInfo,
)
from .producers import PENDING, _int, _need, _plane, _positive

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
Planes = Mapping[str, npt.NDArray[np.generic]]

#: scheme → (scale format, block size along K, has a global scale)
SCHEMES: dict[str, tuple[str, int, bool]] = {"mxfp4": ("e8m0", 32, False), "nvfp4": ("e4m3", 16, True)}
#: compressed-tensors format → scheme, and the compressor's strategy for it.
CT_FORMATS = {"mxfp4-pack-quantized": "mxfp4", "nvfp4-pack-quantized": "nvfp4"}
_CT_STRATEGY = {"mxfp4": "group", "nvfp4": "tensor_group"}
E2M1 = np.array(E2M1_VALUES, dtype=np.float32)
#: Two E2M1 codes per byte along K, the lower index in the low nibble.
FP4_PACKING = Packing(
    axis="K", container_bits=8, scheme="slots", slot_order=(0, 1), bit_order="lsb_first", tail="exact"
)


def _leaf(module: str, leaves: Mapping[str, TensorInfo], leaf: str, dtypes: tuple[str, ...]) -> TensorInfo:
    return _plane(
        module, leaves, leaf, "N,K", dtypes, shape="[N, K/2] or [N, K/G]",
        dtype_remedy="FP4 codes are packed two per byte (U8)",
    )  # fmt: skip


def compressed_tensors_fp4(
    module: str, leaves: Mapping[str, TensorInfo], weights: Mapping[str, Any], fmt: str, label: Label
) -> tuple[tuple[int, int], MicroscaleContract]:
    """Build the contract of a compressed-tensors ``mxfp4-`` / ``nvfp4-pack-quantized`` module."""
    try:
        return _ct_fp4(module, leaves, weights, fmt, label)
    except ValidationError as error:
        raise schema_error(f"{module}.weight", error) from error


def _ct_fp4(
    module: str, leaves: Mapping[str, TensorInfo], weights: Mapping[str, Any], fmt: str, label: Label
) -> tuple[tuple[int, int], MicroscaleContract]:
    name = f"{module}.weight"
    scheme = CT_FORMATS[fmt]
    scale_format, block, has_global = SCHEMES[scheme]
    bits = _int(weights, "num_bits", weight=name)
    group = _int(weights, "group_size", weight=name)
    found = (
        f"type={weights.get('type')}, bits={bits}, group_size={group}, "
        f"strategy={weights.get('strategy')}, symmetric={weights.get('symmetric', True)}"
    )
    if (weights.get("type"), bits, group, weights.get("strategy"), weights.get("symmetric", True)) != (
        "float",
        4,
        block,
        _CT_STRATEGY[scheme],
        True,
    ):
        raise UnsupportedContractError(
            name,
            "weights",
            f"float, 4 bits, group_size {block}, strategy {_CT_STRATEGY[scheme]}, symmetric ({fmt})",
            found,
        )
    packed = _leaf(module, leaves, "weight_packed", ("U8",))
    scale = _leaf(module, leaves, "weight_scale", ())
    n, k = packed.shape[0], packed.shape[1] * 2
    _positive(name, n, k, "the weight_packed shape")
    global_scale: GlobalScaleNone | GlobalScalePlane = GlobalScaleNone(kind="none")
    if has_global:
        info = _need(module, leaves, "weight_global_scale")
        if info.dtype != "F32":
            raise GlobalScaleError(name, f"{info.name} dtype", "F32 (one binary32)", info.dtype)
        global_scale = GlobalScalePlane(
            kind="plane", plane=info.name, physical_dtype="F32", physical_shape=info.shape, law="divide"
        )
    contract = MicroscaleContract(
        family="mx_block",
        scheme=scheme,  # type: ignore[arg-type]  # a key of SCHEMES
        codes=CodesSpec(
            plane=packed.name,
            physical_dtype=packed.dtype,
            physical_shape=packed.shape,
            physical_axes=("N", "K"),
            bits=4,
            encoding="e2m1",
            packing=FP4_PACKING,
        ),
        scales=ScaleSpec(
            plane=scale.name,
            physical_dtype=scale.dtype,
            physical_shape=scale.shape,
            physical_axes=("N", "G"),
            format=scale_format,  # type: ignore[arg-type]  # e8m0 or e4m3
            storage="raw_bits",
            sign="positive",
            group_axis="K",
            group_size=block,
            group_count=-(-k // block),
            tail_rule="exact" if k % block == 0 else "partial_last",
            placement="row_major",
            levels=1,
        ),
        global_scale=global_scale,
        permutation=PermutationNone(kind="none"),
        decode_law="mx_round_bf16",
        label=label,
        grit=PENDING,
    )
    return (n, k), contract


def check_mx_shape(name: str, contract: MicroscaleContract, shape: LogicalShape) -> tuple[str, ...]:
    """Check a microscaling contract against the logical shape (metadata only)."""
    if shape.axes != ("N", "K"):
        raise UnsupportedContractError(name, "shape.axes", "(N, K) for mx_block", shape.axes)
    n, k = shape.extents
    codes, scales = contract.codes, contract.scales
    scale_format, block, has_global = SCHEMES[contract.scheme]
    if codes.encoding != "e2m1":
        raise UnsupportedContractError(name, "codes.encoding", "e2m1", codes.encoding)
    expected = gates.expected_codes_shape(codes, n, k)
    if codes.physical_shape != expected:
        raise PlaneShapeError(
            name,
            f"{codes.plane} shape",
            f"{list(expected)} for N={n}, K={k}, two 4-bit codes per byte along {codes.packing.axis}",
            list(codes.physical_shape),
        )
    if scales.format != scale_format:
        raise ScaleFormatError(
            name, "scales.format", f"{scale_format} ({contract.scheme} block scales)", scales.format
        )
    if scales.group_size != block or scales.group_axis != "K" or scales.levels != 1:
        raise ScaleShapeError(
            name,
            "scales grouping",
            f"one level of blocks of {block} along K ({contract.scheme})",
            f"{scales.levels} level(s) of {scales.group_size} along {scales.group_axis}",
        )
    if k % block:
        raise TailGroupError(name, "K", f"a multiple of {block} ({contract.scheme} has no partial block)", k)
    gates.check_scale_plane(name, scales, scales.physical_dtype, scales.physical_shape, n, k)
    _check_global_spec(name, contract, has_global)
    perm = contract.permutation
    if isinstance(perm, PermutationPlane) and perm.physical_shape != (k,):
        raise PlaneShapeError(name, f"{perm.plane} shape", [k], list(perm.physical_shape))
    return (
        "contract.codes_shape",
        "contract.tail_group",
        "contract.scale_shape",
        "contract.scale_format",
        "contract.global_scale",
        "contract.companion_shapes",
    )


def _check_global_spec(name: str, contract: MicroscaleContract, has_global: bool) -> None:
    glob = contract.global_scale
    if has_global != isinstance(glob, GlobalScalePlane):
        raise GlobalScaleError(
            name,
            "global_scale",
            f"{'a binary32 plane' if has_global else 'none'} ({contract.scheme})",
            glob.kind,
            "NVFP4 block scales are relative to a per-tensor scale; MXFP4's are absolute",
        )
    if isinstance(glob, GlobalScalePlane) and glob.physical_shape not in ((1,), ()):
        raise GlobalScaleError(
            name, f"{glob.plane} shape", "[1] or [] (one value per tensor)", list(glob.physical_shape)
        )


def global_value(name: str, glob: GlobalScalePlane, plane: npt.NDArray[np.generic]) -> np.float32:
    """The global scale as binary32, after checking it is one positive finite number."""
    value = as_plane(plane, glob.physical_dtype, glob.physical_shape, glob.plane).reshape(-1)
    g = np.float32(value[0])
    if not (np.isfinite(g) and g > 0):
        raise GlobalScaleError(
            name,
            f"{glob.plane} value",
            "one positive finite binary32",
            repr(float(g)),
            "a zero, negative or non-finite global scale makes every block scale meaningless",
        )
    return g


def check_mx_values(name: str, contract: MicroscaleContract, planes: Planes, k: int) -> tuple[str, ...]:
    """Check the planes' contents: codes byte count, finite positive scales, global scale, permutation."""
    codes = contract.codes
    as_plane(planes[codes.plane], codes.physical_dtype, codes.physical_shape, codes.plane)
    plane_values.check_scales(name, contract.scales, planes)
    if isinstance(contract.global_scale, GlobalScalePlane):
        global_value(name, contract.global_scale, planes[contract.global_scale.plane])
    plane_values.check_permutation(name, contract, planes, k)
    return ("values.codes", "values.scales", "values.global_scale", "values.permutation")


def block_scales(
    name: str,
    contract: MicroscaleContract,
    scale_plane: npt.NDArray[np.generic],
    global_plane: npt.NDArray[np.generic] | None,
    index: I64 | None,
) -> F32:
    """The binary32 scale of every block ``[rows, G]``, after the global scale (if any) is applied."""
    scales = contract.scales
    plane = as_plane(scale_plane, scales.physical_dtype, scales.physical_shape, scales.plane)
    oriented = plane if scales.physical_axes[0] == "N" else plane.T
    s = scale_to_f32(np.ascontiguousarray(oriented), scales.format, scales.plane)
    s = s if index is None else s[index]
    glob = contract.global_scale
    if isinstance(glob, GlobalScalePlane) and global_plane is not None:
        g = global_value(name, glob, global_plane)
        s = s / g if glob.law == "divide" else s * g
    return s.astype(np.float32, copy=False)
