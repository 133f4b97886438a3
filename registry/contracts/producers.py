"""Contract templates of the producers whose layouts shardport knows: GPTQ, AWQ, compressed-tensors.

Each builder takes one module's companion tensors (by leaf name) and the producer's settings, and
returns the logical ``[N, K]`` extents and an :class:`AffineIntContract` (GRIT record still blank).

- GPTQ: ``qweight`` int32 ``[K*b/32, N]`` packed along K in natural slot order; ``qzeros`` int32
  ``[ceil(K/G), N*b/32]`` packed along N, storing zero-1 (``checkpoint_format: gptq``) or the zero
  (``gptq_v2``); ``scales`` ``[ceil(K/G), N]``; optional ``g_idx`` int32 ``[K]``.
- AWQ (GEMM): ``qweight`` int32 ``[K, N/8]`` packed along N in slot order ``[0,2,4,6,1,3,5,7]``;
  ``qzeros`` int32 ``[K/G, N/8]``, same order, zero as is; ``scales`` ``[K/G, N]``.
- compressed-tensors ``pack-quantized``: ``weight_packed`` int32 ``[N, ceil(K*b/32)]``, a little-endian
  bitstream along K of codes offset by ``2^(b-1)``; ``weight_scale`` ``[N, K/G]`` (``[N, 1]`` per
  channel); asymmetric: ``weight_zero_point`` int32 ``[ceil(N*b/32), K/G]``, a bitstream along N.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from .errors import (
    ContractAmbiguousError,
    PlaneDtypeError,
    PlaneMissingError,
    PlaneRankError,
    PlaneShapeError,
    UnsupportedContractError,
    schema_error,
)
from .model import (
    AffineIntContract,
    Axis,
    CodesSpec,
    GritRecord,
    GroupMapIndex,
    GroupMapNone,
    Label,
    Packing,
    PermutationNone,
    ScaleFormat,
    ScaleSpec,
    TensorInfo,
    ZeroIntPlane,
    ZeroNone,
)

PENDING = GritRecord(expressible=False, grade=None, grade_id=None, why="pending")
_SCALE_FORMAT: dict[str, ScaleFormat] = {"F16": "binary16", "BF16": "bfloat16", "F32": "binary32"}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True, slots=True)
class Settings:
    """A producer's settings as read from the checkpoint (or declared), with the evidence."""

    method: str
    params: Mapping[str, Any]
    label: Label


def _need(module: str, leaves: Mapping[str, TensorInfo], leaf: str) -> TensorInfo:
    if leaf not in leaves:
        raise PlaneMissingError(
            f"{module}.weight",
            f"plane {module}.{leaf}",
            "present",
            "absent",
            "the checkpoint lost a companion tensor of this quantized weight",
        )
    return leaves[leaf]


_INT32_REMEDY = "this producer packs its fields into int32 containers; re-export the checkpoint with it"


def _plane(
    module: str,
    leaves: Mapping[str, TensorInfo],
    leaf: str,
    axes: str,
    dtypes: Sequence[str] = (),
    *,
    shape: str | None = None,
    dtype_remedy: str = _INT32_REMEDY,
) -> TensorInfo:
    """The companion ``leaf`` with as many dimensions as ``axes`` names and (if given) one of ``dtypes``.

    ``shape``: how the expected shape reads in the error (default ``[axes]``).
    """
    info = _need(module, leaves, leaf)
    rank = len(axes.split(","))
    if len(info.shape) != rank:
        raise PlaneRankError(
            f"{module}.weight",
            f"plane {info.name} rank",
            f"{rank} dimension(s) {shape or f'[{axes}]'}",
            f"{len(info.shape)} dimension(s) {list(info.shape)}",
            "the plane was flattened or reshaped; re-export the checkpoint with its producer",
        )
    if dtypes and info.dtype not in dtypes:
        where = f"plane {info.name} dtype"
        raise PlaneDtypeError(f"{module}.weight", where, " or ".join(dtypes), info.dtype, dtype_remedy)
    return info


def _int(params: Mapping[str, Any], *keys: str, weight: str) -> int | None:
    """The first of ``keys`` present in ``params``, as an integer."""
    for key in keys:
        value = params.get(key)
        if value is None:
            continue
        number = None
        if not isinstance(value, bool) and isinstance(value, int | str | float):
            with contextlib.suppress(ValueError, OverflowError):
                number = int(value)
        if number is None or (isinstance(value, float) and number != value):
            raise UnsupportedContractError(weight, f"quantization.{key}", "an integer", repr(value))
        return number
    return None


def _positive(weight: str, n: int, k: int, source: str) -> None:
    """A quantized weight has at least one row and one column."""
    if n < 1 or k < 1:
        raise PlaneShapeError(weight, f"logical shape [N, K] from {source}", "N >= 1 and K >= 1", [n, k])


def _valid(weight: str, build: Any, *args: Any) -> tuple[tuple[int, int], AffineIntContract]:
    """Run a contract builder; a pydantic ``ValidationError`` becomes a :class:`ContractSchemaError`."""
    try:
        result: tuple[tuple[int, int], AffineIntContract] = build(*args)
    except ValidationError as error:
        raise schema_error(weight, error) from error
    return result


def _slots(axis: Literal["N", "K"], bits: int, order: Sequence[int] | None = None) -> Packing:
    per = 32 // bits
    return Packing(
        axis=axis,
        container_bits=32,
        scheme="slots",
        slot_order=tuple(order or range(per)),
        bit_order="lsb_first",
        tail="exact",
    )


def _scale_format(module: str, info: TensorInfo) -> ScaleFormat:
    if info.dtype not in _SCALE_FORMAT:
        raise UnsupportedContractError(
            f"{module}.weight", f"{info.name} dtype", "F16, BF16 or F32", info.dtype
        )
    return _SCALE_FORMAT[info.dtype]


def _scale(module: str, info: TensorInfo, axes: tuple[Axis, Axis], group: int, k: int) -> ScaleSpec:
    return ScaleSpec(
        plane=info.name,
        physical_dtype=info.dtype,
        physical_shape=info.shape,
        physical_axes=axes,
        format=_scale_format(module, info),
        storage="numeric",
        sign="positive",
        group_axis="K",
        group_size=group,
        group_count=-(-k // group),
        tail_rule="partial_last" if k % group else "exact",
        placement="row_major",
        levels=1,
    )


def gptq(
    module: str, leaves: Mapping[str, TensorInfo], settings: Settings
) -> tuple[tuple[int, int], AffineIntContract]:
    """Build the contract of a GPTQ module (``checkpoint_format`` gptq → zero-1, gptq_v2 → as is)."""
    return _valid(f"{module}.weight", _gptq, module, leaves, settings)


def _gptq(
    module: str, leaves: Mapping[str, TensorInfo], settings: Settings
) -> tuple[tuple[int, int], AffineIntContract]:
    params = settings.params
    weight = f"{module}.weight"
    bits = _int(params, "bits", "w_bit", weight=weight) or 0
    if bits not in (2, 4, 8):
        raise UnsupportedContractError(f"{module}.weight", "quantization.bits", "2, 4 or 8 for GPTQ", bits)
    qweight = _plane(module, leaves, "qweight", "K/pack,N", ("I32",))
    qzeros = _plane(module, leaves, "qzeros", "G,N/pack", ("I32",))
    scales = _plane(module, leaves, "scales", "G,N")
    if "g_idx" in leaves:
        _plane(module, leaves, "g_idx", "K")
    n = qweight.shape[1]
    k = leaves["g_idx"].shape[0] if "g_idx" in leaves else qweight.shape[0] * 32 // bits
    _positive(weight, n, k, "the qweight (and g_idx) shapes")
    group = _int(params, "group_size", weight=weight) or -1
    group = k if group <= 0 else group
    fmt = str(params.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedContractError(
            f"{module}.weight", "quantization.checkpoint_format", "gptq or gptq_v2", fmt
        )
    if "g_idx" in leaves:
        sequential = params.get("desc_act") is False
        group_map: GroupMapIndex | GroupMapNone = GroupMapIndex(
            kind="g_idx",
            plane=leaves["g_idx"].name,
            physical_dtype=leaves["g_idx"].dtype,
            physical_shape=leaves["g_idx"].shape,
            sequential=sequential,
        )
    elif params.get("desc_act"):
        raise PlaneMissingError(
            f"{module}.weight", f"plane {module}.g_idx", "present (desc_act: true)", "absent"
        )
    else:
        group_map = GroupMapNone(kind="none")
    contract = AffineIntContract(
        family="affine_int",
        codes=CodesSpec(
            plane=qweight.name,
            physical_dtype=qweight.dtype,
            physical_shape=qweight.shape,
            physical_axes=("K", "N"),
            bits=bits,
            encoding=f"u{bits}",
            packing=_slots("K", bits),
        ),
        scales=_scale(module, scales, ("G", "N"), group, k),
        zero_point=ZeroIntPlane(
            kind="int_plane",
            plane=qzeros.name,
            physical_dtype=qzeros.dtype,
            physical_shape=qzeros.shape,
            physical_axes=("G", "N"),
            bits=bits,
            encoding=f"u{bits}",
            packing=_slots("N", bits),
            convention="minus_one" if fmt == "gptq" else "as_is",
        ),
        group_map=group_map,
        permutation=PermutationNone(kind="none"),
        decode_law="affine_f32",
        label=settings.label,
        grit=PENDING,
    )
    return (n, k), contract


def awq(
    module: str, leaves: Mapping[str, TensorInfo], settings: Settings
) -> tuple[tuple[int, int], AffineIntContract]:
    """Build the contract of an AWQ GEMM module (4-bit, interleaved slot order, zero as is)."""
    return _valid(f"{module}.weight", _awq, module, leaves, settings)


def _awq(
    module: str, leaves: Mapping[str, TensorInfo], settings: Settings
) -> tuple[tuple[int, int], AffineIntContract]:
    params = settings.params
    weight = f"{module}.weight"
    bits = _int(params, "bits", "w_bit", weight=weight) or 0
    version = str(params.get("version", "gemm")).lower()
    if bits != 4 or version != "gemm" or params.get("zero_point") is False:
        raise UnsupportedContractError(
            f"{module}.weight",
            "quantization",
            "AWQ GEMM, 4-bit, zero_point: true",
            f"bits={bits}, version={version}, zero_point={params.get('zero_point')}",
        )
    qweight = _plane(module, leaves, "qweight", "K,N/pack", ("I32",))
    qzeros = _plane(module, leaves, "qzeros", "G,N/pack", ("I32",))
    scales = _plane(module, leaves, "scales", "G,N")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    _positive(weight, n, k, "the qweight shape")
    group = _int(params, "group_size", "q_group_size", weight=weight) or -1
    group = k if group <= 0 else group
    contract = AffineIntContract(
        family="affine_int",
        codes=CodesSpec(
            plane=qweight.name,
            physical_dtype=qweight.dtype,
            physical_shape=qweight.shape,
            physical_axes=("K", "N"),
            bits=4,
            encoding="u4",
            packing=_slots("N", 4, AWQ_ORDER),
        ),
        scales=_scale(module, scales, ("G", "N"), group, k),
        zero_point=ZeroIntPlane(
            kind="int_plane",
            plane=qzeros.name,
            physical_dtype=qzeros.dtype,
            physical_shape=qzeros.shape,
            physical_axes=("G", "N"),
            bits=4,
            encoding="u4",
            packing=_slots("N", 4, AWQ_ORDER),
            convention="as_is",
        ),
        group_map=GroupMapNone(kind="none"),
        permutation=PermutationNone(kind="none"),
        decode_law="affine_f32",
        label=settings.label,
        grit=PENDING,
    )
    return (n, k), contract


def _bitstream(axis: Literal["N", "K"]) -> Packing:
    return Packing(
        axis=axis,
        container_bits=32,
        scheme="bitstream",
        slot_order=(),
        bit_order="lsb_first",
        tail="zero_fill",
    )


def compressed_tensors(
    module: str,
    leaves: Mapping[str, TensorInfo],
    weights: Mapping[str, Any],
    shape_values: Sequence[int] | None,
    label: Label,
) -> tuple[tuple[int, int], AffineIntContract]:
    """Build the contract of a compressed-tensors ``pack-quantized`` module from its weight args."""
    return _valid(f"{module}.weight", _compressed_tensors, module, leaves, weights, shape_values, label)


def _compressed_tensors(
    module: str,
    leaves: Mapping[str, TensorInfo],
    weights: Mapping[str, Any],
    shape_values: Sequence[int] | None,
    label: Label,
) -> tuple[tuple[int, int], AffineIntContract]:
    name = f"{module}.weight"
    bits = _int(weights, "num_bits", weight=name) or 0
    strategy = str(weights.get("strategy", ""))
    if weights.get("type", "int") != "int" or not 2 <= bits <= 8 or strategy not in ("group", "channel"):
        raise UnsupportedContractError(
            name,
            "weights",
            "int, 2..8 bits, strategy group or channel",
            f"type={weights.get('type')}, bits={bits}, strategy={strategy}",
        )
    packed = _plane(module, leaves, "weight_packed", "N,K/pack", ("I32",))
    scale = _plane(module, leaves, "weight_scale", "N,G")
    group_size = _int(weights, "group_size", weight=name) if strategy == "group" else 1
    if not group_size:
        raise UnsupportedContractError(name, "weights.group_size", "a positive integer", group_size)
    n = packed.shape[0]
    k = _ct_columns(module, strategy, group_size, scale, shape_values)
    _positive(name, n, k, "weight_packed and weight_shape (or weight_scale)")
    group = group_size if strategy == "group" else k
    encoding = f"s{bits}_offset{1 << (bits - 1)}"
    zero = _ct_zero(module, leaves, weights, bits, encoding)
    group_map = _ct_group_map(module, leaves)
    contract = AffineIntContract(
        family="affine_int",
        codes=CodesSpec(
            plane=packed.name,
            physical_dtype=packed.dtype,
            physical_shape=packed.shape,
            physical_axes=("N", "K"),
            bits=bits,
            encoding=encoding,
            packing=_bitstream("K"),
        ),
        scales=_scale(module, scale, ("N", "G"), group, k),
        zero_point=zero,
        group_map=group_map,
        permutation=PermutationNone(kind="none"),
        decode_law="affine_round_to_scale_format",
        label=label,
        grit=PENDING,
    )
    return (n, k), contract


def _ct_columns(
    module: str, strategy: str, group_size: int, scale: TensorInfo, shape_values: Sequence[int] | None
) -> int:
    """K: from the ``weight_shape`` values when read, else (grouped) from the scale plane's groups."""
    name = f"{module}.weight"
    if shape_values is not None:
        if len(shape_values) != 2 or not all(isinstance(v, int) and v > 0 for v in shape_values):
            raise PlaneShapeError(
                name, f"values of {module}.weight_shape", "[N, K], two positive integers", list(shape_values)
            )
        return int(shape_values[-1])
    if strategy == "group":
        return scale.shape[1] * group_size
    raise ContractAmbiguousError(
        name,
        "K",
        f"the value of {module}.weight_shape",
        "only its shape",
        "per-channel packing does not fix K; pass the weight_shape values",
    )


def _ct_zero(
    module: str, leaves: Mapping[str, TensorInfo], weights: Mapping[str, Any], bits: int, encoding: str
) -> ZeroIntPlane | ZeroNone:
    """Symmetric: no zero point; asymmetric: ``weight_zero_point``, a bitstream packed along N."""
    if weights.get("symmetric", True):
        return ZeroNone(kind="none")
    zp = _plane(module, leaves, "weight_zero_point", "N/pack,G", ("I32",))
    return ZeroIntPlane(
        kind="int_plane",
        plane=zp.name,
        physical_dtype=zp.dtype,
        physical_shape=zp.shape,
        physical_axes=("N", "G"),
        bits=bits,
        encoding=encoding,
        packing=_bitstream("N"),
        convention="as_is",
    )


def _ct_group_map(module: str, leaves: Mapping[str, TensorInfo]) -> GroupMapIndex | GroupMapNone:
    """A ``weight_g_idx`` plane (activation order), or columns grouped in order."""
    if "weight_g_idx" not in leaves:
        return GroupMapNone(kind="none")
    g_idx = _plane(module, leaves, "weight_g_idx", "K")
    return GroupMapIndex(
        kind="g_idx",
        plane=g_idx.name,
        physical_dtype=g_idx.dtype,
        physical_shape=g_idx.shape,
        sequential=False,
    )
