"""CPU int8 weight-only as a catalog kernel: :func:`.int8_cpu.int8_weight_only_matmul` with a capability.

Takes signed 8-bit codes with one scale per row and no zero point (compressed-tensors int8 ``channel``,
any affine contract of that shape). GGUF Q8_0 is admitted by layout but refused by its groups: one
scale per 32 elements cannot be folded into one per row without changing the weight (the direct GGUF
block kernel runs it). Preparation unpacks the codes once into a C-contiguous int8 ``[N, K]`` tensor
(a repack: the same integers) and keeps the scales; where the activation dtype is narrower than the
scales, or the decode law rounds each product, it is a conversion with its error recorded.

At load time the codes are used as loaded where their bytes already are the int8 values: 8-bit fields
packed four to a little-endian 32-bit word along K (compressed-tensors' pack-quantized) or an unpacked
int8 plane are viewed, not copied, two's complement as they are and offset-128 fields with their top
bit flipped (one pass); anything else goes through the registry's generic unpacking. The conversion
error is taken over each row's table of the 256 codes, restricted to the codes the row holds -- the
same number as comparing every element.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.decode import affine_qparams, affine_terms
from shardport.registry.contracts.formats import round_to_format
from shardport.registry.contracts.model import AffineIntContract, GroupMapNone, LogicalShape, PermutationPlane
from shardport.registry.contracts.packing import apply_encoding

from .budget import EPS, TINY, Budget, law_eps, rounding_budget
from .capability import Capability, OperatorSignature
from .errors import KernelInputError
from .prepared import F32, I64, ROW_CHUNK, PreparedLinear
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
    # Vectorised for bfloat16 only (torch 2.13, N = K = 4096, one thread): bfloat16 1.0 ms at T = 1,
    # 15 ms at T = 32; float32 14 ms and 675 ms, float16 30 ms and 545 ms.
    slow_activations=("float32", "float16"),
)


I8 = npt.NDArray[np.int8]
_BYTES = np.arange(256, dtype=np.int64)
_VALUES = np.arange(-128, 128, dtype=np.float32)  # column c of a row's code table is code c - 128


def _contract(weight: RankWeight) -> AffineIntContract:
    c = weight.contract
    if not isinstance(c, AffineIntContract) or c.scales.group_count != 1:
        raise KernelInputError(weight.where, "contract", "affine int8 with one scale per row", c.family)
    return c


def _codes_and_scales(weight: RankWeight) -> tuple[I64, F32]:
    """int8 codes ``[N, K]`` and per-row binary32 scales ``[N]`` by the registry's generic unpacking.

    The oracle the parity ladder's L1 compares the kernel's codes with, and the preparation of the
    representations whose bytes are not already the codes.
    """
    c = _contract(weight)
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    terms = affine_terms(c, weight.named_planes, shape, None, weight.where)
    if terms.q.size and (terms.q.min() < -128 or terms.q.max() > 127):
        raise KernelInputError(weight.where, "codes", "-128..127", f"{terms.q.min()}..{terms.q.max()}")
    return terms.q, np.ascontiguousarray(terms.scale[:, 0], dtype=np.float32)


def _bytes_as_codes(c: AffineIntContract, weight: RankWeight) -> I8 | None:
    """The int8 codes as the loaded bytes (a view, or one XOR pass); None where they are not such bytes."""
    codes, pack = c.codes, c.codes.packing
    plane = weight.named_planes[codes.plane]
    n, k = weight.n_local, weight.k_local
    if codes.bits != 8 or codes.physical_axes != ("N", "K") or isinstance(c.permutation, PermutationPlane):
        return None
    if not isinstance(c.group_map, GroupMapNone) or not np.little_endian or plane.dtype.byteorder == ">":
        return None
    if pack.axis == "none":  # one code per container: the container's value
        if plane.dtype != np.int8 or plane.shape != (n, k):
            return None
        stored, byte_value = plane, _BYTES - 256 * (_BYTES >= 128)  # byte b holds the value int8(b)
    else:
        identity = pack.scheme == "bitstream" or tuple(pack.slot_order) == (0, 1, 2, 3)
        if (pack.axis, pack.container_bits, pack.bit_order, identity) != ("K", 32, "lsb_first", True):
            return None
        if plane.dtype.itemsize != 4 or plane.shape != (n, k // 4) or k % 4:
            return None
        stored, byte_value = plane, _BYTES  # field i of a word is its little-endian byte i, unsigned
    table = apply_encoding(byte_value, codes.encoding, 8, packed=pack.axis != "none")
    data = np.ascontiguousarray(stored).view(np.uint8).reshape(n, k)
    if np.array_equal(table, _BYTES - 256 * (_BYTES >= 128)):
        view: I8 = data.view(np.int8)  # the bytes are the codes
        return view
    if np.array_equal(table, _BYTES - 128):
        flipped: I8 = np.bitwise_xor(data, np.uint8(0x80)).view(np.int8)
        return flipped
    return None


def _row_presence(codes: I8) -> npt.NDArray[np.bool_]:
    """``[N, 256]``: whether row ``n`` holds code ``c - 128`` (a row block at a time)."""
    n = codes.shape[0]
    held = np.zeros((n, 256), dtype=bool)
    for r in range(0, n, ROW_CHUNK):
        stop = min(r + ROW_CHUNK, n)
        index = codes[r:stop].view(np.uint8).astype(np.int32) ^ 0x80  # code + 128
        index += (np.arange(stop - r, dtype=np.int32) * 256)[:, None]
        held[r:stop] = np.bincount(index.reshape(-1), minlength=(stop - r) * 256).reshape(-1, 256) > 0
    return held


class PreparedInt8(PreparedLinear):
    """Codes as C-contiguous int8 and one scale per row in the activation dtype."""

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        import torch

        c = _contract(weight)
        codes = _bytes_as_codes(c, weight)
        if codes is None:
            q, scales = _codes_and_scales(weight)
            codes = np.ascontiguousarray(q, dtype=np.int8)
        else:
            shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
            scales = np.ascontiguousarray(
                affine_qparams(c, weight.named_planes, shape, weight.where)[1][:, 0]
            )
        with warnings.catch_warnings():  # a view of the loaded (read-only) bytes: the kernel only reads it
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            self.codes = torch.from_numpy(codes)
        self.scales = torch.from_numpy(scales.astype(np.float32)).to(getattr(torch, op.activation_dtype))
        super().__init__(kernel, op, "repack")
        self.conversion_error = self._conversion_error(c, codes, scales) if codes.size else 0.0
        if self.conversion_error:
            self.transformation = "conversion"

    def _conversion_error(self, c: AffineIntContract, codes: I8, scales: F32) -> float:
        """``max |W_kernel - W_reference|`` (binary32), over each row's codes: a ``[N, 256]`` table."""
        mine = _VALUES * self.scales.float().numpy()[:, None]  # as decode_rows evaluates each element
        reference = _VALUES * scales.astype(np.float32)[:, None]  # as the decode law does
        if c.decode_law == "affine_round_to_scale_format":
            reference = round_to_format(reference, c.scales.format)
        diff = np.abs(mine - reference)
        if not diff.any():
            return 0.0
        return float(np.max(diff, where=_row_presence(codes), initial=0.0))

    def _run(self, x: Any) -> Any:
        from .int8_cpu import int8_weight_only_matmul  # torch: only when a rank runs the kernel

        return int8_weight_only_matmul(x, self.codes, self.scales, tensor=self.op.weight)

    @property
    def resident_bytes(self) -> int:
        """The int8 codes (the loaded plane itself where its bytes are the codes) and the per-row scales."""
        return int(self.codes.numel() + self.scales.numel() * self.scales.element_size())

    def decode_rows(self, start: int, stop: int) -> F32:
        """``codes · scale`` in binary32, the scale as the kernel holds it."""
        scale = self.scales[start:stop].float().numpy()[:, None]
        out: F32 = self.codes[start:stop].numpy().astype(np.float32) * scale
        return out

    def conversion_budget(self, weight: RankWeight, reference: F32) -> Budget | None:
        """Per-row scales held in the activation dtype; the law's rounding where the kernel skips it."""
        q, scales = _codes_and_scales(weight)
        dtype = self.op.activation_dtype
        return rounding_budget(
            np.abs(q.astype(np.float64)) * np.abs(scales.astype(np.float64))[:, None],
            reference,
            held_in=f"int8pack's per-row scales in {dtype}",
            eps_terms=EPS[dtype],
            eps_law=law_eps(weight.contract),
            tiny=TINY[dtype],
            what="|q|·|scale|",
        )

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
