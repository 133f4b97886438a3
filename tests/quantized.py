"""Independent GPTQ/AWQ packers and inventories, written from the formats' descriptions.

They share no code with the package's unpacking, so agreement between the two is evidence rather
than tautology. Used by the contract tests and by the push/pull tests of quantized checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardport.registry.contracts import TensorInfo

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
_DTYPES = {"int32": "I32", "float16": "F16", "float32": "F32", "int64": "I64", "uint8": "U8", "int8": "I8"}


def pack_along_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ qweight: values [K, N] -> int32 [K*bits/32, N], natural order along K."""
    per = 32 // bits
    k, n = values.shape
    out = np.zeros((k // per, n), dtype=np.uint32)
    for lane in range(per):
        out |= values[lane::per].astype(np.uint32) << np.uint32(bits * lane)
    return out.view(np.int32)


def pack_along_columns(values: np.ndarray, bits: int, order: list[int] | None = None) -> np.ndarray:
    """Pack values [R, C] -> int32 [R, C*bits/32] along columns; slot i holds run element order[i]."""
    per = 32 // bits
    order = order or list(range(per))
    r, c = values.shape
    out = np.zeros((r, c // per), dtype=np.uint32)
    for slot in range(per):
        out |= values[:, order[slot] :: per].astype(np.uint32) << np.uint32(bits * slot)
    return out.view(np.int32)


def expected_decode(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, group: np.ndarray) -> np.ndarray:
    """W[n, k] = s[g(k), n] * (q[k, n] - z[g(k), n]) in float32; q is [K, N]."""
    diff = (q.astype(np.int64) - zeros[group, :].astype(np.int64)).astype(np.float32)
    return (diff * scales[group, :].astype(np.float32)).T


def make_quantized(
    n: int, k: int, group_size: int, *, bits: int = 4, seed: int = 0, act_order: bool = False
) -> dict[str, Any]:
    """Random codes, zeros (never 0 or max, so both conventions stay in range) and fp16 scales."""
    rng = np.random.default_rng(seed)
    groups = -(-k // group_size)
    maxq = (1 << bits) - 1
    q = rng.integers(0, maxq + 1, size=(k, n))
    zeros = rng.integers(1, maxq, size=(groups, n))
    scales = (rng.random((groups, n)) * 0.02 + 0.001).astype(np.float16)
    group = np.arange(k) // group_size
    if act_order:
        group = group[rng.permutation(k)]
    return {"q": q, "zeros": zeros, "scales": scales, "g_idx": group.astype(np.int32), "bits": bits}


def gptq_planes(
    case: dict[str, Any], prefix: str, *, stored_zero_offset: int = -1, g_idx: bool = True
) -> dict[str, np.ndarray]:
    bits = case["bits"]
    planes = {
        f"{prefix}.qweight": pack_along_rows(case["q"], bits),
        f"{prefix}.qzeros": pack_along_columns(case["zeros"] + stored_zero_offset, bits),
        f"{prefix}.scales": case["scales"],
    }
    if g_idx:
        planes[f"{prefix}.g_idx"] = case["g_idx"]
    return planes


def awq_planes(case: dict[str, Any], prefix: str) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.qweight": pack_along_columns(case["q"], 4, AWQ_ORDER),
        f"{prefix}.qzeros": pack_along_columns(case["zeros"], 4, AWQ_ORDER),
        f"{prefix}.scales": case["scales"],
    }


def inventory(
    planes: dict[str, np.ndarray], overrides: dict[str, str] | None = None
) -> dict[str, TensorInfo]:
    overrides = overrides or {}
    return {
        name: TensorInfo(name, overrides.get(name, _DTYPES[str(array.dtype)]), tuple(array.shape))
        for name, array in planes.items()
    }


def quantize_minmax(weight: np.ndarray, group_size: int, bits: int = 4) -> dict[str, Any]:
    """Honest asymmetric min-max quantization of ``weight`` [N, K] per K-group, in the layout of
    :func:`make_quantized` (codes [K, N], zeros and fp16 scales [K/G, N])."""
    n, k = weight.shape
    maxq = (1 << bits) - 1
    groups = k // group_size
    w = weight.reshape(n, groups, group_size)
    lo, hi = w.min(axis=2), w.max(axis=2)
    scales = ((hi - lo) / maxq).astype(np.float16)
    s = scales.astype(np.float32)
    zeros = np.clip(np.round(-lo / s), 1, maxq - 1).astype(np.int64)
    q = np.clip(np.round(w / s[:, :, None]) + zeros[:, :, None], 0, maxq).astype(np.int64)
    return {
        "q": q.reshape(n, k).T.copy(),
        "zeros": zeros.T.copy(),
        "scales": scales.T.copy(),
        "g_idx": (np.arange(k) // group_size).astype(np.int32),
        "bits": bits,
    }


GPTQ_RTN = {
    "quantization_config": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "desc_act": False,
        "checkpoint_format": "gptq",
    }
}


def honest_gptq(seed: int = 5) -> tuple[Any, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A round-to-nearest 4-bit GPTQ weight [64, 256] of a standard-normal float weight.

    Returns (the inferred logical weight, its planes, the float weight, the mask of top-code elements).
    """
    from shardport.registry.contracts import infer_safetensors

    w = np.random.default_rng(seed).standard_normal((64, 256)).astype(np.float32)
    case = quantize_minmax(w, 32)
    planes = gptq_planes(case, "model.layers.0.mlp.down_proj")
    (weight,) = infer_safetensors(GPTQ_RTN, inventory(planes))
    return weight, planes, w, case["q"].T == 15
