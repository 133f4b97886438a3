"""CPU int8 weight-only as a catalog kernel: :func:`.int8_cpu.int8_weight_only_matmul` with a capability.

Takes signed 8-bit codes with one scale per row and no zero point (compressed-tensors int8 ``channel``,
any affine contract of that shape). GGUF Q8_0 is admitted by layout but refused by its groups: one
scale per 32 elements cannot be folded into one per row without changing the weight (the direct GGUF
block kernel runs it). Preparation unpacks the codes once into a C-contiguous int8 ``[N, K]`` tensor
(a repack: the same integers) and keeps the scales; where the activation dtype is narrower than the
scales, or the decode law rounds each product, it is a conversion with its error recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardport.registry.contracts.decode import affine_terms
from shardport.registry.contracts.formats import round_to_format
from shardport.registry.contracts.model import AffineIntContract, LogicalShape

from .capability import Capability, OperatorSignature
from .errors import KernelInputError
from .int8_cpu import int8_weight_only_matmul
from .prepared import F32, I64, PreparedLinear
from .weight import RankWeight

CAPABILITY = Capability(
    id="cpu.int8pack",
    version="1",
    abi="torch aten._weight_int8pack_mm (shardport.kernels.int8_cpu)",
    layouts=("affine:s8:*", "affine:s8_offset128:*", "gguf:Q8_0"),
    code_encodings=("s8", "s8_offset128"),
    scale_formats=("binary16", "bfloat16", "binary32"),
    scale_signs=("positive", "signed"),
    scale_levels=(1,),
    zero_points=("none",),
    group_sizes=None,
    scale_per_row=True,
    transformation="repack",
)


def _codes_and_scales(weight: RankWeight) -> tuple[I64, F32, F32]:
    """int8 codes ``[N, K]``, per-row binary32 scales ``[N]`` and the decode law's rows (binary32)."""
    c = weight.contract
    if not isinstance(c, AffineIntContract) or c.scales.group_count != 1:
        raise KernelInputError(weight.where, "contract", "affine int8 with one scale per row", c.family)
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    terms = affine_terms(c, weight.named_planes, shape, None, weight.where)
    if terms.q.size and (terms.q.min() < -128 or terms.q.max() > 127):
        raise KernelInputError(weight.where, "codes", "-128..127", f"{terms.q.min()}..{terms.q.max()}")
    reference = terms.q.astype(np.float32) * terms.scale[:, :1]
    if c.decode_law == "affine_round_to_scale_format":
        reference = round_to_format(reference, c.scales.format)
    return terms.q, np.ascontiguousarray(terms.scale[:, 0], dtype=np.float32), reference


class PreparedInt8(PreparedLinear):
    """Codes as C-contiguous int8 and one scale per row in the activation dtype."""

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        import torch

        q, scales, reference = _codes_and_scales(weight)
        self.codes = torch.from_numpy(np.ascontiguousarray(q, dtype=np.int8))
        self.scales = torch.from_numpy(scales).to(getattr(torch, op.activation_dtype))
        super().__init__(kernel, op, "repack")
        self.conversion_error = float(np.abs(self.decode() - reference).max()) if q.size else 0.0
        if self.conversion_error:
            self.transformation = "conversion"

    def _run(self, x: Any) -> Any:
        return int8_weight_only_matmul(x, self.codes, self.scales, tensor=self.op.weight)

    @property
    def resident_bytes(self) -> int:
        """The int8 codes and the per-row scales."""
        return int(self.codes.numel() + self.scales.numel() * self.scales.element_size())

    def decode_rows(self, start: int, stop: int) -> F32:
        """``codes · scale`` in binary32, the scale as the kernel holds it."""
        scale = self.scales[start:stop].float().numpy()[:, None]
        out: F32 = self.codes[start:stop].numpy().astype(np.float32) * scale
        return out

    def code_check(self, weight: RankWeight) -> tuple[I64, I64] | None:
        """(codes the planes hold, the int8 codes the kernel reads)."""
        return _codes_and_scales(weight)[0], self.codes.numpy().astype(np.int64)


class Int8CpuKernel:
    """CPU int8 weight-only (per-channel scales) on ``_weight_int8pack_mm``."""

    capability = CAPABILITY

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Unpack the codes once into int8 ``[N, K]``; keep the per-row scales."""
        cap = self.capability
        return PreparedInt8(weight, op, f"{cap.id}@{cap.version}")
