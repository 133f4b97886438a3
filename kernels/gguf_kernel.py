"""The direct GGUF block kernel as a catalog kernel: :func:`.gguf_direct.gguf_block_matmul` with a capability.

The rank's block bytes are used as they are (transformation ``none``): the kernel decodes one tile of
rows at a time inside the matmul into a bounded float32 workspace and keeps no float copy of the
weight. It takes every type :data:`.gguf_types.GGUF_DIRECT_TYPES` names (Q8_0, the K-quants, MXFP4,
NVFP4, ...), computes in float32 and returns the activation dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .capability import Capability, OperatorSignature
from .gguf_types import GGUF_DIRECT_TYPES
from .prepared import F32, ColumnCheck, PreparedLinear
from .weight import RankWeight

TILE_ROWS = 256

CAPABILITY = Capability(
    id="cpu.gguf-direct",
    version="1",
    abi="shardport.kernels.gguf_direct.gguf_block_matmul (tiled decode + torch.matmul, float32)",
    layouts=tuple(sorted(f"gguf:{t}" for t in GGUF_DIRECT_TYPES)),
    code_encodings=None,
    scale_formats=None,
    scale_signs=("positive", "signed"),
    scale_levels=(0, 1, 2),
    zero_points=None,
    group_sizes=None,
    scale_per_row=False,
    workspace_bytes=TILE_ROWS * 4 * 16384,
    transformation="none",
)


class PreparedGguf(PreparedLinear):
    """Holds the rank's block plane as loaded (no copy); decodes a tile of rows per step of each call."""

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        from .gguf_direct import workspace_bytes  # torch: only when a rank prepares the kernel

        super().__init__(kernel, op, "none")
        assert op.ggml_type is not None
        self.ggml_type = op.ggml_type
        self.blocks = np.ascontiguousarray(weight.planes["codes"]).reshape(weight.n_local, -1)
        self.workspace = workspace_bytes(self.ggml_type, weight.k_local, TILE_ROWS)

    def _run(self, x: Any) -> Any:
        from .gguf_direct import gguf_block_matmul

        y = gguf_block_matmul(
            x, self.blocks, self.ggml_type, self.op.k_local, tile_rows=TILE_ROWS, tensor=self.op.weight
        )
        return y.to(x.dtype)

    @property
    def resident_bytes(self) -> int:
        """The block plane (shared with the loader's array)."""
        return int(self.blocks.nbytes)

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows decoded by the kernel's own tile decoders: the tiles its matmul multiplies.

        L3 checks the products. Decoding through the matmul on identity activations said the same at
        ``K`` times the cost (an ``[8000, 2048]`` Q8_0 head slice: 0.7 s of one core).
        """
        from .gguf_direct import gguf_block_decode

        rows = self.blocks[start:stop]
        out: F32 = gguf_block_decode(rows, self.ggml_type, self.op.k_local, tensor=self.op.weight).numpy()
        return out

    def column_check(
        self,
        weight: RankWeight,
        columns: npt.NDArray[np.int64],
        reference: F32 | None = None,
        rows: npt.NDArray[np.int64] | None = None,
    ) -> ColumnCheck | None:
        """(the reference decode of K ``columns``, the values the kernel's matmul reads there).

        The block bytes are read through :func:`~.gguf_direct.gguf_block_matmul` itself on one-hot
        binary32 activations: each output is ``1·w`` plus products by 0, so the kernel's value of every
        element of these columns comes back exactly (its binary32 computation, before the cast to the
        activation dtype). Values, not codes: the block types' scales (and the IQ types' grids) have no
        common unit-scale form to read codes through; a code read wrong changes its value unless its
        block's scale is 0. ``rows``: only those rows' blocks go through the kernel (rows are
        independent blocks) and through the reference decoder.
        """
        import torch

        from shardport.registry.contracts.decode import decode_weight

        from .gguf_direct import gguf_block_matmul

        x = torch.zeros(len(columns), self.op.k_local, dtype=torch.float32)
        x[torch.arange(len(columns)), torch.from_numpy(np.asarray(columns, dtype=np.int64))] = 1.0
        blocks = self.blocks if rows is None else np.ascontiguousarray(self.blocks[rows])
        y = gguf_block_matmul(
            x, blocks, self.ggml_type, self.op.k_local, tile_rows=TILE_ROWS, tensor=self.op.weight
        )
        found = np.ascontiguousarray(y.to(torch.float32).t().numpy())
        if rows is not None:
            at = [int(r) for r in rows]
            reference = decode_weight(weight.local_weight, weight.named_planes, at)
        elif reference is None:
            reference = decode_weight(weight.local_weight, weight.named_planes)
        return np.ascontiguousarray(reference[:, columns]), found, "values"


class GgufDirectKernel:
    """Direct GGUF block kernel: the bytes as loaded, decoded a tile at a time inside the matmul."""

    capability = CAPABILITY

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Nothing to repack: keep the block plane."""
        cap = self.capability
        return PreparedGguf(weight, op, f"{cap.id}@{cap.version}")
