"""The oracle and the last resort: the registry's reference decode, then ``torch.matmul``.

- ``reference``: decodes the rank's planes with the registry's reference decoder (binary32, a chunk of
  rows at a time, at every call) and multiplies in float32. It is the oracle of the parity ladder and
  admissible for every representation the decoder knows; as an execution path it is a full dequant.
- ``full-dequant``: reconstructs the whole weight once, in the activation dtype, and calls
  ``torch.matmul``. It keeps a full-size float copy, so it is only selected where the policy allows
  full dequantization (forbidden by default).

Both run on the operator's device: the reference multiplies on the activations' device (its decoded rows
are moved there), the full dequant holds its copy on the signature's device (the current CUDA device
for a ``cuda`` signature) and returns results on the activations' device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardport.registry.contracts.decode import decode_weight

from .budget import EPS, TINY, Budget, rounding_budget
from .capability import Capability, OperatorSignature
from .device import cuda_device
from .errors import KernelInputError
from .prepared import F32, ROW_CHUNK, PreparedLinear
from .weight import RankWeight


def _any(kernel_id: str, abi: str) -> Capability:
    return Capability(
        id=kernel_id,
        version="1",
        abi=abi,
        layouts=("*",),
        code_encodings=None,
        scale_formats=None,
        scale_signs=("positive", "signed"),
        scale_levels=(0, 1, 2),
        zero_points=None,
        group_sizes=None,
        scale_per_row=False,
        scale_axes=("K", "N"),
        act_order=True,
        permutation=True,
        tail_group=True,
        devices=("cpu", "cuda"),
        transformation="full-dequant",
    )


REFERENCE = _any("reference", "shardport.registry.contracts.decode + torch.matmul (float32)")
FULL_DEQUANT = _any("full-dequant", "shardport.registry.contracts.decode once + torch.matmul")


class PreparedReference(PreparedLinear):
    """Holds the rank's planes as loaded; decodes a chunk of rows per step of every call."""

    no_codes = (
        "the reference decoder itself: the operator decodes the planes at every call with the decoder "
        "L1 and L2 compare against, and holds no layout of its own to read codes back from"
    )

    def __init__(self, weight: RankWeight, op: OperatorSignature) -> None:
        super().__init__(f"{REFERENCE.id}@{REFERENCE.version}", op, "full-dequant")
        self.weight = weight
        self.local = weight.local_weight
        decode_weight(self.local, weight.named_planes, [0])  # refuse now what the decoder cannot decode

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows of the reference decode (binary32)."""
        return decode_weight(self.local, self.weight.named_planes, range(start, stop))

    def _run(self, x: Any) -> Any:
        import torch

        x32 = x.float()
        parts = []
        for r in range(0, self.op.n_local, ROW_CHUNK):
            rows = torch.from_numpy(self.decode_rows(r, min(r + ROW_CHUNK, self.op.n_local)))
            parts.append(x32 @ rows.to(x32.device).T)
        return torch.cat(parts, dim=1).to(x.dtype)

    @property
    def resident_bytes(self) -> int:
        """The planes as loaded (shared with the loader's arrays, not copied)."""
        return self.weight.plane_bytes


class PreparedFullDequant(PreparedLinear):
    """The whole weight reconstructed once in the activation dtype: a persistent full-size float copy."""

    no_codes = (
        "a dense float copy: the codes are not kept (L2 holds its values to the reference decode, within "
        "the rounding to the activation dtype)"
    )

    def __init__(self, weight: RankWeight, op: OperatorSignature) -> None:
        import torch

        super().__init__(f"{FULL_DEQUANT.id}@{FULL_DEQUANT.version}", op, "full-dequant")
        device = torch.device("cpu")
        if op.device.kind == "cuda":
            if cuda_device() is None:
                raise KernelInputError(weight.where, "CUDA device", "a CUDA device torch can see", "none")
            device = torch.device("cuda", torch.cuda.current_device())  # pragma: no cover - no GPU in CI
        values = decode_weight(weight.local_weight, weight.named_planes)
        self.dense = torch.from_numpy(values).to(device=device, dtype=getattr(torch, op.activation_dtype))
        back = self.dense.float().cpu().numpy()
        self.conversion_error = float(np.abs(back - values).max()) if values.size else 0.0

    def conversion_budget(self, weight: RankWeight, reference: F32) -> Budget | None:
        """Every value rounded once to the activation dtype."""
        dtype = self.op.activation_dtype
        return rounding_budget(
            None,
            reference,
            held_in=f"a dense {dtype} copy",
            eps_terms=0.0,
            eps_value=EPS[dtype],
            tiny=TINY[dtype],
            what="0",
        )

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows of the dense copy, widened to binary32."""
        return self.dense[start:stop].float().cpu().numpy()

    def _run(self, x: Any) -> Any:
        y = x.to(self.dense.device) @ self.dense.T
        return y if y.device == x.device else y.to(x.device)

    @property
    def resident_bytes(self) -> int:
        """The dense copy: ``n_local · k_local ·`` the activation dtype's size."""
        return int(self.dense.numel() * self.dense.element_size())


class ReferenceKernel:
    """The registry's reference decode + float32 matmul (the oracle)."""

    capability = REFERENCE

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Keep the planes; decode at every call."""
        return PreparedReference(weight, op)


class FullDequantKernel:
    """Reconstruct once and ``torch.matmul`` (a full-size float copy; policy must allow full dequant)."""

    capability = FULL_DEQUANT

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Decode the whole slice once into a dense tensor of the activation dtype."""
        return PreparedFullDequant(weight, op)
