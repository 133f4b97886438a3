"""CPU int8 weight-only matmul on ``torch.ops.aten._weight_int8pack_mm``, and the contract it fits.

``y = x @ (codes * scales[:, None]).T``: signed int8 codes ``[N, K]``, one scale per output channel
(row), no zero point. The contract of the op, learned by experiment on torch 2.13.0+cpu (AVX512
dispatch, this machine; ``tests/kernels/test_int8_cpu.py`` pins each point):

- ``x`` (A): 2-D ``[T, K]``, float32, bfloat16 or float16 (float64 refused: "expect A to be either
  32-bit or 16-bit float tensor"); its last dimension must be contiguous (a row-strided slice is
  fine). The result is ``[T, N]`` in x's dtype. T = 0 works.
- ``codes`` (B): int8 only (uint8/int32 refused), 2-D ``[N, K]``, C-contiguous (else refused). No N or
  K multiple is needed (N = 1, K = 1, odd N and K all work); N = 0 and K = 0 work.
- ``scales``: 1-D of exactly N, in x's dtype (a float32 scale with bfloat16 x is refused). HAZARD: a
  non-contiguous scale vector (e.g. a column of a wider array) is accepted and read as if it were
  contiguous, giving wrong results without an error; this module always passes a contiguous copy.
  NaN and negative scales are not checked (the contract gates check scales upstream).
- Numerics: bfloat16 x → float32 accumulation of x·q, times the bfloat16 scale in float32, rounded
  once to bfloat16 (bit-equal to that emulation). float32 x → float32 accumulation (within ~K * 2**-24
  relative of the float64 product). With a bfloat16/float16 x the float32 scales are narrowed to that
  dtype first: a *conversion* (relative error <= 2**-8 for bfloat16, 2**-11 for float16 normals;
  a float16 scale below 2**-14 loses more, one above 65504 overflows), reported by :func:`int8_fits`.
- Speed at N = K = 4096 here: bfloat16 x is the fast path (T=1 ≈ 5 ms, T=32 ≈ 50 ms); float32 x
  is slow (T=1 ≈ 40 ms, T=32 ≈ 650 ms, slower than dequantize + float32 ``torch.matmul``); float16
  slower still (T=32 ≈ 1.2 s). Dispatch should prefer bfloat16 activations for this kernel.

Scales that are not one per row do not fit: per-group scales along K (GGUF Q8_0's one scale per 32
elements, group-quantized int8 from other producers) cannot be folded into one per-row scale without
changing the weight, so :func:`int8_fits` refuses them and the caller picks another kernel (the direct
GGUF block kernel for Q8_0). A zero point also does not fit (the op has no zero term).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .gguf_errors import ActivationError, Int8ContractError

_ACTIVATIONS = (torch.float32, torch.bfloat16, torch.float16)
_SCALES = (torch.float32, torch.bfloat16, torch.float16)

#: Relative error bound of narrowing a float32 scale to the activation dtype (round to nearest,
#: normal range): half an ulp.
_NARROWING_REL_ERROR = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@dataclass(frozen=True, slots=True)
class Int8Fit:
    """Whether a weight fits ``_weight_int8pack_mm``, and at what cost.

    ``fits`` False carries the ``reason``. ``conversion`` is True when the scales must be narrowed to
    the activation dtype (not a permutation of the bytes: the parity ladder records it), with
    ``max_scale_rel_error`` the bound on each scale's relative change.
    """

    fits: bool
    reason: str = ""
    conversion: bool = False
    max_scale_rel_error: float = 0.0


def int8_fits(
    *,
    n: int,
    k: int,
    code_bits: int = 8,
    code_signed: bool = True,
    scale_groups: int = 1,
    zero_point: bool = False,
    scale_dtype: torch.dtype = torch.float32,
    act_dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> Int8Fit:
    """The op's contract as a pure predicate over a weight's description.

    ``scale_groups`` is the number of scales per row along K (1 = per-channel; GGUF Q8_0 has K/32).
    Fits only signed 8-bit codes, one scale per row, no zero point, a CPU device, and an activation
    dtype the op takes; any N, K >= 0.
    """
    refusals = []
    if device != "cpu":
        refusals.append(f"device {device!r}: this kernel is CPU-only")
    if n < 0 or k < 0:
        refusals.append(f"shape [{n}, {k}]: N and K must be >= 0")
    if (code_bits, code_signed) != (8, True):
        refusals.append(f"codes {'s' if code_signed else 'u'}int{code_bits}: only signed int8 codes")
    if scale_groups != 1:
        refusals.append(
            f"{scale_groups} scale groups per row: only per-channel scales (one per row) fit; "
            "per-group scales along K (e.g. GGUF Q8_0's one per 32) need a block or group kernel"
        )
    if zero_point:
        refusals.append("a zero point: the op computes codes * scale with no zero term")
    if scale_dtype not in _SCALES:
        refusals.append(f"scale dtype {scale_dtype}: float32, bfloat16 or float16 only")
    if act_dtype not in _ACTIVATIONS:
        refusals.append(f"activation dtype {act_dtype}: float32, bfloat16 or float16 only")
    if refusals:
        return Int8Fit(False, "; ".join(refusals))
    if act_dtype == torch.float32 or scale_dtype == act_dtype:
        return Int8Fit(True)  # the scales reach the op unchanged or widened exactly
    return Int8Fit(True, conversion=True, max_scale_rel_error=_NARROWING_REL_ERROR[act_dtype])


def _as_tensor(value: object, field: str, tensor: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            return torch.from_numpy(value)
    raise Int8ContractError(tensor, field, "a torch tensor or numpy array", type(value).__name__)


def _check_activation(x: object, k: int, tensor: str) -> torch.Tensor:
    """``x`` as a 2-D CPU activation of an accepted dtype whose K matches, else ActivationError."""
    if isinstance(x, torch.Tensor) and x.ndim == 2 and x.dtype in _ACTIVATIONS and x.device.type == "cpu":
        if x.shape[1] != k:
            raise ActivationError(tensor, "x columns", f"K = {k}", x.shape[1], "x and codes disagree on K")
        return x
    found = f"{x.dtype} {list(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
    raise ActivationError(
        tensor, "x", "a 2-D [T, K] float32/bfloat16/float16 CPU tensor", found,
        "flatten leading dimensions to T and pass the activation on the CPU",
    )  # fmt: skip


def int8_weight_only_matmul(
    x: torch.Tensor,
    codes: torch.Tensor | np.ndarray,
    scales: torch.Tensor | np.ndarray,
    *,
    tensor: str = "int8 weight",
) -> torch.Tensor:
    """``x @ (codes * scales[:, None]).T`` as ``[T, N]`` in x's dtype, on ``_weight_int8pack_mm``.

    ``codes``: C-contiguous int8 ``[N, K]`` (used in place, never copied); ``scales``: ``[N]``, one per
    row (narrowed to x's dtype when x is bfloat16/float16). Raises :class:`~.gguf_errors.Int8ContractError`
    for codes or scales that do not fit and :class:`~.gguf_errors.ActivationError` for a bad ``x``.
    """
    code_t = _as_tensor(codes, "codes", tensor)
    if code_t.dtype != torch.int8 or code_t.ndim != 2:
        raise Int8ContractError(
            tensor, "codes", "int8 [N, K]", f"{code_t.dtype} {list(code_t.shape)}",
            "only signed 8-bit codes fit; unsigned or wider codes need another kernel",
        )  # fmt: skip
    if not code_t.is_contiguous() or code_t.device.type != "cpu":
        raise Int8ContractError(
            tensor, "codes layout", "C-contiguous on the CPU",
            f"strides {tuple(code_t.stride())} on {code_t.device}",
            "prepare the codes once as a contiguous CPU plane",
        )  # fmt: skip
    n, k = code_t.shape
    scale_t = _as_tensor(scales, "scales", tensor)
    if scale_t.dtype not in _SCALES:
        raise Int8ContractError(tensor, "scales dtype", "float32, bfloat16 or float16", scale_t.dtype)
    if scale_t.ndim == 2 and scale_t.shape[0] == n and scale_t.shape[1] == 1:
        scale_t = scale_t.reshape(n)
    if scale_t.ndim != 1 or scale_t.shape[0] != n:
        raise Int8ContractError(
            tensor, "scales shape", f"[{n}] (one per output row)", list(scale_t.shape),
            "per-group scales along K (e.g. GGUF Q8_0 blocks) do not fit this kernel; use the direct "
            "GGUF block kernel or a group-quant kernel",
        )  # fmt: skip
    x = _check_activation(x, k, tensor)
    # The op reads scales as if contiguous (a strided view gives wrong results silently): copy them.
    scale_x = scale_t.to(device="cpu", dtype=x.dtype).contiguous()
    x_in = x if x.stride(-1) == 1 else x.contiguous()
    with torch.no_grad():
        y: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x_in, code_t, scale_x)
    return y
