"""Capability signatures (what a kernel consumes) and operator signatures (what a rank's weight asks for).

A :class:`Capability` is declared by each kernel; an :class:`OperatorSignature` is derived from a
:class:`~.weight.RankWeight` plus the activation dtype, the phase and the device. Admission
(:mod:`.admission`) compares the two field by field. Both are plain frozen data, recorded in the
dispatch trace.

Layout ids (:func:`layout_id`) are derived from the contract, never from the tiled storage layout:
``gguf:Q4_0``; ``float:BF16``; ``affine:u4:slots32@K:KN:01234567`` — the code encoding, the packing
scheme and container, the packed axis, the physical axis order and the slot order (``bitstream`` has
none). Capabilities list the layouts they take as ``fnmatch`` patterns (``affine:u4:*``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.contracts.model import (
    AffineIntContract,
    FloatContract,
    GgufBlockContract,
    GroupMapIndex,
    PermutationPlane,
    ZeroFloatPlane,
    ZeroImplicit,
    ZeroIntPlane,
)

from .device import Device
from .weight import AnyContract, RankWeight

Phase = Literal["prefill", "decode"]
Transformation = Literal["none", "repack", "conversion", "generic", "full-dequant"]
ActivationDtype = Literal["float32", "bfloat16", "float16"]

#: GGUF types: (zero-point kind, scale levels, sub-block group size) as the admission fields see them.
_GGUF_FIELDS: dict[str, tuple[str, int, int]] = {
    "Q8_0": ("none", 1, 32),
    "Q4_0": ("implicit", 1, 32),
    "Q4_1": ("float_min", 1, 32),
    "Q5_0": ("implicit", 1, 32),
    "Q5_1": ("float_min", 1, 32),
    "Q4_K": ("float_min", 2, 32),
    "Q5_K": ("float_min", 2, 32),
    "Q6_K": ("implicit", 2, 16),
}
_GGUF_CODES: dict[str, tuple[str, int]] = {
    "Q8_0": ("s8", 8),
    "Q4_0": ("u4", 4),
    "Q4_1": ("u4", 4),
    "Q5_0": ("u5", 5),
    "Q5_1": ("u5", 5),
    "Q4_K": ("u4", 4),
    "Q5_K": ("u5", 5),
    "Q6_K": ("u6", 6),
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Capability(_Frozen):
    """What a kernel consumes and produces; ``None`` in a set-valued field means "any".

    ``layouts``: fnmatch patterns of layout ids; ``zero_points``: ``none``, ``implicit``,
    ``int_plane/as_is``, ``int_plane/minus_one``, ``float_plane``, ``float_min`` (GGUF's additive
    minimum); ``group_sizes``: along K; ``scale_per_row``: only one scale per row (a group of all K);
    ``tail_group``: whether a last, partial group is taken; ``n_multiple``/``k_multiple``: of the
    rank-local extents; ``slice_alignment``: the slice's first
    column must be a multiple of it (besides the group size); ``workspace_bytes``: the most scratch one
    call uses beyond its output; ``transformation``: what preparing does to the planes;
    ``slow_activations``: activation dtypes the kernel admits but runs on an unvectorised (scalar)
    path — admission is unchanged, only the order of the candidates is (:func:`.catalog.ordered`: a
    kernel on its slow path comes after every kernel on its fast path). The defaults describe a CPU
    kernel taking any slice in either phase with float32/bfloat16/float16 activations, each fast.
    """

    id: str
    version: str
    abi: str
    layouts: tuple[str, ...]
    code_encodings: tuple[str, ...] | None
    scale_formats: tuple[str, ...] | None
    scale_signs: tuple[str, ...]
    scale_levels: tuple[int, ...]
    zero_points: tuple[str, ...] | None
    group_sizes: tuple[int, ...] | None
    scale_per_row: bool
    transformation: Transformation
    scale_axes: tuple[str, ...] = ("K",)
    act_order: bool = False
    permutation: bool = False
    tail_group: bool = False
    activation_dtypes: tuple[ActivationDtype, ...] = ("float32", "bfloat16", "float16")
    slow_activations: tuple[ActivationDtype, ...] = ()
    accumulator_dtype: str = "float32"
    output_dtype: Literal["activation", "float32"] = "activation"
    n_multiple: int = 1
    k_multiple: int = 1
    slice_alignment: int = 1
    workspace_bytes: int = 0
    devices: tuple[Literal["cpu", "cuda"], ...] = ("cpu",)
    cpu_isas: tuple[str, ...] | None = None
    cuda_min_cc: tuple[int, int] | None = None
    phases: tuple[Phase, ...] = ("prefill", "decode")


class OperatorSignature(_Frozen):
    """What one rank's linear operator asks for: its weight's numeric contract, slice and activations."""

    weight: str
    family: str
    layout: str
    code_encoding: str | None
    code_bits: int | None
    scale_format: str | None
    scale_sign: str | None
    scale_levels: int
    zero_point: str
    group_size: int | None
    scale_axis: str | None
    act_order: bool
    permutation: bool
    tail_group: bool
    decode_law: str
    ggml_type: str | None
    n_local: int
    k_local: int
    row_start: int
    col_start: int
    activation_dtype: ActivationDtype
    phase: Phase
    device: Device


def layout_id(contract: AnyContract) -> str:
    """The layout id a kernel consumes, derived from the contract (see the module docstring)."""
    if isinstance(contract, GgufBlockContract):
        return f"gguf:{contract.ggml_type}"
    if isinstance(contract, FloatContract):
        return f"float:{contract.physical_dtype}"
    codes = contract.codes
    pack = codes.packing
    axes = "".join(codes.physical_axes)
    if pack.axis == "none":
        return f"affine:{codes.encoding}:plain{pack.container_bits}:{axes}"
    order = "".join(str(i) for i in pack.slot_order) if pack.scheme == "slots" else "stream"
    return f"affine:{codes.encoding}:{pack.scheme}{pack.container_bits}@{pack.axis}:{axes}:{order}"


def _zero_kind(contract: AffineIntContract) -> str:
    zero = contract.zero_point
    if isinstance(zero, ZeroIntPlane):
        return f"int_plane/{zero.convention}"
    if isinstance(zero, ZeroFloatPlane):
        return "float_plane"
    if isinstance(zero, ZeroImplicit):
        return "implicit"
    return "none"


def operator_signature(
    weight: RankWeight, activation_dtype: ActivationDtype, phase: Phase, device: Device
) -> OperatorSignature:
    """Derive the operator signature of a rank's weight for one phase on one device."""
    c = weight.contract
    fields: dict[str, Any] = {
        "weight": weight.where,
        "family": c.family,
        "layout": layout_id(c),
        "decode_law": c.decode_law,
        "n_local": weight.n_local,
        "k_local": weight.k_local,
        "row_start": weight.row_start,
        "col_start": weight.col_start,
        "activation_dtype": activation_dtype,
        "phase": phase,
        "device": device,
        "act_order": False,
        "permutation": False,
        "tail_group": False,
        "ggml_type": None,
        "code_encoding": None,
        "code_bits": None,
        "scale_format": None,
        "scale_sign": None,
        "scale_levels": 0,
        "zero_point": "none",
        "group_size": None,
        "scale_axis": None,
    }
    if isinstance(c, AffineIntContract):
        size = c.scales.group_size
        fields.update(
            code_encoding=c.codes.encoding,
            code_bits=c.codes.bits,
            scale_format=c.scales.format,
            scale_sign=c.scales.sign,
            scale_levels=c.scales.levels,
            zero_point=_zero_kind(c),
            group_size=size,
            scale_axis=c.scales.group_axis,
            tail_group=weight.k_local % size != 0,
            act_order=isinstance(c.group_map, GroupMapIndex) and not c.group_map.sequential,
            permutation=isinstance(c.permutation, PermutationPlane),
        )
    elif isinstance(c, GgufBlockContract):
        fields["ggml_type"] = c.ggml_type
        if c.ggml_type in _GGUF_FIELDS:
            zero, levels, group = _GGUF_FIELDS[c.ggml_type]
            encoding, bits = _GGUF_CODES[c.ggml_type]
            fields.update(
                code_encoding=encoding,
                code_bits=bits,
                scale_format="binary16",
                scale_sign="signed",
                scale_levels=levels,
                zero_point=zero,
                group_size=group,
                scale_axis="K",
            )
    return OperatorSignature.model_validate(fields)


def gguf_block_elements(ggml_type: str) -> int:
    """Elements per block of a GGUF type (1 for the float types)."""
    return BLOCK_SIZES[ggml_type][0]
