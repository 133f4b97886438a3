"""Admission: a pure predicate over (operator signature, kernel capability) → accepted or refused-because.

Every field the capability constrains is compared; a refusal lists every reason found (a typed
:class:`Reason` with what the kernel expects and what the operator has), in a fixed order: device and
phase first, then the representation, then the shapes.
"""

from __future__ import annotations

import enum
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict

from .capability import Capability, OperatorSignature


class Reason(str, enum.Enum):
    """Why a kernel refuses an operator."""

    DEVICE = "device"
    ISA = "isa"
    CUDA_CC = "cuda_cc"
    PHASE = "phase"
    LAYOUT = "layout"
    CODE_ENCODING = "code_encoding"
    SCALE_FORMAT = "scale_format"
    SCALE_SIGN = "scale_sign"
    SCALE_LEVELS = "scale_levels"
    SCALE_AXIS = "scale_axis"
    ZERO_POINT = "zero_point"
    GROUP_SIZE = "group_size"
    ACT_ORDER = "act_order"
    PERMUTATION = "permutation"
    TAIL_GROUP = "tail_group"
    N_MULTIPLE = "n_multiple"
    K_MULTIPLE = "k_multiple"
    SLICE_ALIGNMENT = "slice_alignment"
    ACTIVATION_DTYPE = "activation_dtype"
    NOT_REQUIRED = "not_required"
    POLICY = "policy"
    PREPARE = "prepare"


class Refusal(BaseModel):
    """One reason a kernel refuses: the field, what the kernel takes, what the operator has."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Reason
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.reason.value}: expected {self.expected}, found {self.found}"


class Admission(BaseModel):
    """The verdict of :func:`admit`: ``accepted``, or the refusals (never both)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: str
    accepted: bool
    refusals: tuple[Refusal, ...]

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """The refusal reasons, in check order."""
        return tuple(r.reason for r in self.refusals)

    def __str__(self) -> str:
        if self.accepted:
            return f"{self.kernel}: accepted"
        return f"{self.kernel}: refused ({'; '.join(str(r) for r in self.refusals)})"


def _member(out: list[Refusal], reason: Reason, allowed: tuple[Any, ...] | None, found: Any) -> None:
    if allowed is not None and found not in allowed:
        out.append(Refusal(reason=reason, expected=f"one of {list(allowed)}", found=repr(found)))


def _device(op: OperatorSignature, cap: Capability, out: list[Refusal]) -> None:
    device = op.device
    if device.kind not in cap.devices:
        out.append(Refusal(reason=Reason.DEVICE, expected=f"one of {list(cap.devices)}", found=str(device)))
        return
    if device.kind == "cpu" and cap.cpu_isas is not None and device.isa not in cap.cpu_isas:
        out.append(Refusal(reason=Reason.ISA, expected=f"one of {list(cap.cpu_isas)}", found=str(device.isa)))
    if device.kind == "cuda" and cap.cuda_min_cc is not None and (device.cc or (0, 0)) < cap.cuda_min_cc:
        out.append(Refusal(reason=Reason.CUDA_CC, expected=f">= sm{cap.cuda_min_cc}", found=str(device.cc)))


def _representation(op: OperatorSignature, cap: Capability, out: list[Refusal]) -> None:
    if not any(fnmatchcase(op.layout, pattern) for pattern in cap.layouts):
        out.append(Refusal(reason=Reason.LAYOUT, expected=f"one of {list(cap.layouts)}", found=op.layout))
        return
    _member(out, Reason.CODE_ENCODING, cap.code_encodings, op.code_encoding)
    _member(out, Reason.SCALE_FORMAT, cap.scale_formats, op.scale_format)
    if op.scale_sign is not None:
        _member(out, Reason.SCALE_SIGN, cap.scale_signs, op.scale_sign)
    _member(out, Reason.SCALE_LEVELS, cap.scale_levels, op.scale_levels)
    if op.scale_axis is not None:
        _member(out, Reason.SCALE_AXIS, cap.scale_axes, op.scale_axis)
    _member(out, Reason.ZERO_POINT, cap.zero_points, op.zero_point)
    if op.group_size is not None:
        _member(out, Reason.GROUP_SIZE, cap.group_sizes, op.group_size)
        if cap.scale_per_row and op.group_size < op.k_local:
            out.append(
                Refusal(
                    reason=Reason.GROUP_SIZE,
                    expected=f"one scale per row (a group of all K_local={op.k_local} columns)",
                    found=f"{op.k_local // op.group_size} groups of {op.group_size} along K per row",
                )
            )
    if op.act_order and not cap.act_order:
        out.append(
            Refusal(reason=Reason.ACT_ORDER, expected="groups in column order", found="act-order g_idx")
        )
    if op.permutation and not cap.permutation:
        out.append(Refusal(reason=Reason.PERMUTATION, expected="no column permutation", found="a perm plane"))


def _shapes(op: OperatorSignature, cap: Capability, out: list[Refusal]) -> None:
    if op.tail_group and not cap.tail_group:
        out.append(
            Refusal(
                reason=Reason.TAIL_GROUP,
                expected=f"K_local a multiple of the group size {op.group_size}",
                found=f"K_local={op.k_local} (a partial last group)",
            )
        )
    if op.n_local % cap.n_multiple:
        out.append(
            Refusal(
                reason=Reason.N_MULTIPLE, expected=f"N_local % {cap.n_multiple} == 0", found=str(op.n_local)
            )
        )
    if op.k_local % cap.k_multiple:
        out.append(
            Refusal(
                reason=Reason.K_MULTIPLE, expected=f"K_local % {cap.k_multiple} == 0", found=str(op.k_local)
            )
        )
    if op.col_start % cap.slice_alignment:
        out.append(
            Refusal(
                reason=Reason.SLICE_ALIGNMENT,
                expected=f"slice start along K % {cap.slice_alignment} == 0",
                found=str(op.col_start),
            )
        )


def admit(op: OperatorSignature, cap: Capability) -> Admission:
    """Whether a kernel with capability ``cap`` may run operator ``op``; pure, no I/O, no torch."""
    out: list[Refusal] = []
    _device(op, cap, out)
    if op.phase not in cap.phases:
        out.append(Refusal(reason=Reason.PHASE, expected=f"one of {list(cap.phases)}", found=op.phase))
    _representation(op, cap, out)
    _shapes(op, cap, out)
    _member(out, Reason.ACTIVATION_DTYPE, cap.activation_dtypes, op.activation_dtype)
    return Admission(kernel=f"{cap.id}@{cap.version}", accepted=not out, refusals=tuple(out))
