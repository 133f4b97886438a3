"""CUDA packed int4 ("tinygemm"): torch's ``_weight_int4pack_mm`` over ``_convert_weight_to_int4pack``.

Nothing here touches CUDA at import: torch is imported where a weight is prepared or run, and
admission (``devices=("cuda",)``, ``cuda_min_cc=(8, 0)``) refuses the kernel on a CPU device before
any preparation. The contract, read from torch's ``aten/src/ATen/native/cuda/int4mm.cu``, its meta
registrations and ``_group_quantize_tensor`` in torch's test helpers (torch >= 2.5):

- ``_convert_weight_to_int4pack(w, innerKTiles)``: ``w`` contiguous **uint8** ``[N, K/2]`` on the GPU,
  byte ``j`` of row ``n`` = ``(u[n, 2j] << 4) | u[n, 2j+1]`` (the even column in the HIGH nibble; codes
  ``u`` in 0..15); ``innerKTiles`` in {2, 4, 8}; ``K % (innerKTiles·16) == 0``. Returns int32
  ``[N/8, K/(innerKTiles·16), 32, innerKTiles/2]`` (the m16n8k16 tensor-core B layout; rows past N are
  zero-padded to a multiple of 8, which the matmul then rejects, so N % 8 == 0 is required).
  (torch < 2.5 took int32 ``[N, K]`` codes instead: refused by the ABI string, not supported here.)
- ``_weight_int4pack_mm(x, packed, group, sz)``: ``x`` contiguous 2-D **bfloat16** ``[T, K]`` (any T;
  float16/float32 are rejected on CUDA); ``group`` in {32, 64, 128, 256}, ``K % group == 0``; ``sz``
  ``[K/group, N, 2]`` bfloat16 (scale, zero); the weight is ``w = (u - 8)·scale + zero``, evaluated as one
  bfloat16 fma per element (``__hfma2``: rounded once to bfloat16), accumulated in float32 by
  ``mma.sync`` and written as bfloat16 ``[T, N]``. It checks ``sz``'s N and last dims but, as on the
  CPU, **not** the number of groups (a short plane reads out of bounds) and not the code range.
- Compute capability >= 8.0 (the kernels are compiled only for ``__CUDA_ARCH__ >= 800``; CUDA >= 12 for
  the repack).

Preparation reuses :func:`~.int4_cpu.int4_terms` (GPTQ, AWQ, compressed-tensors int4, GGUF Q4_0/Q4_1 onto
``scale``/``zero`` with the codes range-checked and the group count checked). Because the kernel's
dequantized weight is a bfloat16 number, the layout is exact only where every ``(u - 8)·scale + zero``
and every scale/zero is representable in bfloat16; otherwise it is labelled a ``conversion`` with its
largest reconstruction error, measured on the host with :func:`layout_rows` (a float64 evaluation
rounded once to bfloat16, as the fma does).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .budget import EPS, TINY, Budget, affine_terms_magnitude, law_eps, rounding_budget
from .capability import Capability, OperatorSignature
from .device import cuda_device
from .errors import ActivationError, KernelInputError
from .int4_cpu import CAPABILITY as CPU_INT4
from .int4_cpu import GROUPS, Int4Form, int4_terms
from .int4_form import table_error
from .prepared import F32, I64, ROW_CHUNK, PreparedLinear
from .weight import RankWeight

#: innerKTiles torch takes, the widest (16-byte loads) first.
INNER_K_TILES = (8, 4, 2)
K_TILE = 16
N_TILE = 8
#: Columns of the identity run through the kernel at a time when reading codes back.
PROBE_COLUMNS = 1024

CAPABILITY = Capability(
    id="cuda.int4-tinygemm",
    version="1",
    abi="torch>=2.5 aten._weight_int4pack_mm/_convert_weight_to_int4pack (CUDA; uint8 [N, K/2] input)",
    layouts=CPU_INT4.layouts,
    code_encodings=CPU_INT4.code_encodings,
    scale_formats=CPU_INT4.scale_formats,
    scale_signs=CPU_INT4.scale_signs,
    scale_levels=(1,),
    zero_points=CPU_INT4.zero_points,
    group_sizes=GROUPS,
    scale_per_row=False,
    n_multiple=N_TILE,
    k_multiple=2 * K_TILE,
    activation_dtypes=("bfloat16",),
    devices=("cuda",),
    cuda_min_cc=(8, 0),
    transformation="repack",
)


def inner_k_tiles(k: int) -> int:
    """The widest ``innerKTiles`` with ``K % (innerKTiles·16) == 0`` (raises when none fits)."""
    for tiles in INNER_K_TILES:
        if k % (tiles * K_TILE) == 0:
            return tiles
    raise KernelInputError(
        "int4-tinygemm", "K_local", f"a multiple of {INNER_K_TILES[-1] * K_TILE}", k, "no innerKTiles fits"
    )


def pack_tinygemm_u8(u: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.uint8]:
    """Codes ``u [N, K]`` (0..15) → the uint8 ``[N, K/2]`` input of ``_convert_weight_to_int4pack``.

    Byte ``j`` of a row holds column ``2j`` in its high nibble and ``2j+1`` in its low nibble.
    """
    if u.ndim != 2 or u.shape[1] % 2:
        raise KernelInputError("int4-tinygemm", "codes", "[N, K] with K even", list(u.shape))
    if u.size and (int(u.min()) < 0 or int(u.max()) > 15):
        raise KernelInputError("int4-tinygemm", "codes", "0..15", f"{int(u.min())}..{int(u.max())}")
    codes = u.astype(np.uint8)
    return np.ascontiguousarray((codes[:, 0::2] << np.uint8(4)) | codes[:, 1::2])


def unpack_tinygemm_u8(packed: npt.NDArray[np.uint8]) -> I64:
    """The inverse of :func:`pack_tinygemm_u8`: uint8 ``[N, K/2]`` → codes ``[N, K]``."""
    high = (packed >> np.uint8(4)).astype(np.int64)
    low = (packed & np.uint8(0x0F)).astype(np.int64)
    return np.stack([high, low], axis=-1).reshape(packed.shape[0], 2 * packed.shape[1])


def round_bf16(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Round float64 values once to bfloat16 (8 significant bits, ties to even); finite inputs."""
    mantissa, exponent = np.frexp(values)
    out: npt.NDArray[np.float64] = np.ldexp(np.rint(mantissa * 256.0), exponent - 8)
    return out


def scale_zero_bf16(form: Int4Form) -> tuple[npt.NDArray[np.float32], bool]:
    """``[G, N, 2]`` (scale, zero) rounded to bfloat16 (held in float32), and whether that was exact."""
    exact64 = np.stack([form.scale, form.zero], axis=-1)
    rounded = round_bf16(exact64)
    return rounded.astype(np.float32), bool(np.array_equal(rounded, exact64))


def layout_rows(u: npt.NDArray[np.integer[Any]], sz: npt.NDArray[np.float32], group: int, start: int) -> F32:
    """Rows ``start..start+len(u)`` of the kernel's weight: bf16(``(u - 8)·scale + zero``), one rounding."""
    cols = np.arange(u.shape[1]) // group
    part = sz[:, start : start + u.shape[0]].astype(np.float64)  # [G, rows, 2]
    scale, zero = part[cols, :, 0].T, part[cols, :, 1].T
    return round_bf16((u.astype(np.float64) - 8.0) * scale + zero).astype(np.float32)


def layout_error(form: Int4Form, sz: npt.NDArray[np.float32], n: int) -> float:
    """Largest ``|W_layout - W_reference|`` over the slice (host only).

    Over each group's 16-code table where the form has one (:func:`~.int4_form.table_error`, the same
    number), else a chunk of rows at a time.
    """
    if form.reference_table is not None:

        def table(rows: npt.NDArray[np.int64], groups: npt.NDArray[np.int64]) -> F32:
            part = sz[groups, rows].astype(np.float64)  # [len, 2]: as layout_rows evaluates each element
            return round_bf16((_CODES - 8.0) * part[:, 0:1] + part[:, 1:2]).astype(np.float32)

        return table_error(form, table)
    worst = 0.0
    for r in range(0, n, 4 * ROW_CHUNK):
        stop = min(r + 4 * ROW_CHUNK, n)
        mine = layout_rows(form.u[r:stop], sz, form.group, r).astype(np.float64)
        diff = np.abs(mine - form.reference_rows(r, stop).astype(np.float64))
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


_CODES = np.arange(16, dtype=np.float64)


def tinygemm_budget(weight: RankWeight, reference: F32) -> Budget:
    """bfloat16 (scale, zero), each value rounded once to bfloat16 by the fma; the law's rounding.

    Host-only (the planes' terms and the reference decode): the budget :meth:`PreparedInt4Cuda.
    conversion_budget` holds the device layout to.
    """
    form = int4_terms(weight, fast=False)
    return rounding_budget(
        affine_terms_magnitude(form.u, form.scale, form.zero, form.group),
        reference,
        held_in="tinygemm's bfloat16 (scale, zero) and bfloat16 fma",
        eps_terms=EPS["bfloat16"],
        eps_value=EPS["bfloat16"],
        eps_law=law_eps(weight.contract),
        tiny=TINY["bfloat16"],
        what="|u - 8|·|scale| + |zero|",
    )


def _torch_call(where: str, op: str, call: Any, *args: Any) -> Any:
    """Call a torch op; a torch error (contract, device, build) becomes a :class:`KernelInputError`."""
    try:
        return call(*args)
    except (RuntimeError, NotImplementedError) as exc:
        raise KernelInputError(
            where, f"torch's {op}", "a call inside the tinygemm contract (see int4_cuda)", str(exc)
        ) from exc


class PreparedInt4Cuda(PreparedLinear):
    """A rank's weight in tinygemm's layout on the current CUDA device (never persisted).

    Activations may come on the CPU (the parity ladder's golden batches): they are moved to the device
    and the output returned on the activations' device.
    """

    def __init__(self, weight: RankWeight, op: OperatorSignature, kernel: str) -> None:
        import torch

        if cuda_device() is None:  # a CUDA signature on a machine whose torch sees no device
            raise KernelInputError(
                weight.where,
                "CUDA device",
                "a CUDA device torch can see",
                f"none (torch {torch.__version__}, CUDA build {torch.version.cuda})",
            )
        form = int4_terms(weight)
        self.group = form.group
        self.inner_k_tiles = inner_k_tiles(weight.k_local)
        self.device = torch.device("cuda", torch.cuda.current_device())
        codes = torch.from_numpy(pack_tinygemm_u8(form.u)).to(self.device)
        convert = torch.ops.aten._convert_weight_to_int4pack
        self.packed = _torch_call(
            weight.where, "_convert_weight_to_int4pack", convert, codes, self.inner_k_tiles
        )
        del codes
        sz, exact = scale_zero_bf16(form)
        self.scale_zero = torch.from_numpy(sz).to(device=self.device, dtype=torch.bfloat16).contiguous()
        super().__init__(kernel, op, "repack")
        self.conversion_error = layout_error(form, sz, weight.n_local)
        if self.conversion_error or not exact:
            self.transformation = "conversion"

    def _check_planes(self) -> None:
        groups = self.op.k_local // self.group
        if tuple(self.scale_zero.shape) != (groups, self.op.n_local, 2):  # it does not check G: OOB read
            raise KernelInputError(
                self.op.weight, "scale_zero", [groups, self.op.n_local, 2], list(self.scale_zero.shape)
            )

    def _run(self, x: Any) -> Any:
        import torch

        if x.device.type not in ("cpu", "cuda"):
            raise ActivationError(self.op.weight, "activations' device", "cpu or cuda", str(x.device))
        self._check_planes()
        mm = torch.ops.aten._weight_int4pack_mm
        y = _torch_call(
            self.op.weight,
            "_weight_int4pack_mm",
            mm,
            x.to(self.device),
            self.packed,
            self.group,
            self.scale_zero,
        )
        return y if x.device == self.device else y.to(x.device)

    @property
    def resident_bytes(self) -> int:
        """Device bytes kept: the packed codes and the bfloat16 (scale, zero) pairs."""
        held = self.packed.numel() * self.packed.element_size()
        return int(held + self.scale_zero.numel() * self.scale_zero.element_size())

    def probe_codes(self) -> I64:
        """Read the codes back out of the packed layout by running the kernel on rows of the identity.

        With every (scale, zero) = (1, 0) the kernel's weight is ``u - 8`` (exact in bfloat16) and each
        output a one-term sum, so ``y = u - 8`` exactly. Returns ``u [n_local, k_local]`` on the host.
        """
        import torch

        k, n = self.op.k_local, self.op.n_local
        ones = torch.zeros(k // self.group, n, 2, dtype=torch.bfloat16, device=self.device)
        ones[..., 0] = 1.0
        out = []
        for at in range(0, k, PROBE_COLUMNS):
            cols = torch.arange(at, min(at + PROBE_COLUMNS, k), device=self.device)
            eye = torch.zeros(cols.numel(), k, dtype=torch.bfloat16, device=self.device)
            eye[torch.arange(cols.numel(), device=self.device), cols] = 1.0
            y = torch.ops.aten._weight_int4pack_mm(eye, self.packed, self.group, ones)
            out.append(y.T.to(torch.int64).cpu().numpy() + 8)
        return np.concatenate(out, axis=1) if out else np.zeros((n, 0), dtype=np.int64)

    def code_check(self, weight: RankWeight) -> tuple[I64, I64] | None:
        """(codes by the registry's generic unpacking, codes read back from the device layout)."""
        return int4_terms(weight, fast=False).u.astype(np.int64, copy=False), self.probe_codes()

    def conversion_budget(self, weight: RankWeight, reference: F32) -> Budget | None:
        """:func:`tinygemm_budget` (the layout's conversion, from the weight's own terms)."""
        return tinygemm_budget(weight, reference)

    def _sz_host(self) -> npt.NDArray[np.float32]:
        out: npt.NDArray[np.float32] = self.scale_zero.float().cpu().numpy()
        return out

    def decode_rows(self, start: int, stop: int) -> F32:
        """Rows of bf16(``(u - 8)·scale + zero``) with ``u`` read back from the device layout."""
        return layout_rows(self.probe_codes()[start:stop], self._sz_host(), self.group, start)

    def decode(self) -> F32:
        """The whole layout decoded, the codes read back through the kernel once."""
        return layout_rows(self.probe_codes(), self._sz_host(), self.group, 0)


class Int4CudaKernel:
    """The CUDA packed int4 kernel (see the module docstring for its contract)."""

    capability = CAPABILITY

    def prepare(self, weight: RankWeight, op: OperatorSignature) -> PreparedLinear:
        """Repack the rank's planes into tinygemm's layout on the current CUDA device."""
        cap = self.capability
        return PreparedInt4Cuda(weight, op, f"{cap.id}@{cap.version}")
