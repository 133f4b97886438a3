"""Quantized weights of every representation the CPU int4 kernel takes, and rank-local slices of them.

Each builder quantizes a seeded float weight ``[N, K]`` with the format's own packer (tests/quantized.py
for GPTQ/AWQ, the compressed-tensors package, gguf-py), infers the contract with the registry, records a
cell witness, and returns a :class:`Case`. :func:`slice_planes` cuts the planes of one rank as placement
does: a column-parallel split cuts N, a row-parallel split cuts K, at whole groups / blocks / words.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants
from quantized import AWQ_ORDER, inventory, pack_along_columns, pack_along_rows, quantize_minmax

from shardport.registry.contracts import TensorInfo, infer_gguf, infer_safetensors, make_witness
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.contracts.model import (
    AffineIntContract,
    GgufBlockContract,
    GroupMapIndex,
    LogicalWeight,
    ZeroIntPlane,
    contract_planes,
)

PREFIX = "model.layers.0.mlp.down_proj"


@dataclass(frozen=True)
class Case:
    """A logical weight (with witness), its full planes by tensor name, and the float weight it came from."""

    label: str
    weight: LogicalWeight
    planes: dict[str, np.ndarray]
    float_weight: np.ndarray


def _float(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)


def _finish(label: str, weight: LogicalWeight, planes: dict[str, np.ndarray], w: np.ndarray) -> Case:
    witness = make_witness(weight, planes, seed=7)
    return Case(label, weight.model_copy(update={"witness": witness}), planes, w)


def _only(weights: tuple[LogicalWeight, ...]) -> LogicalWeight:
    return next(x for x in weights if x.name == f"{PREFIX}.weight")


def gptq(n: int, k: int, group: int, seed: int = 0, *, v2: bool = False) -> Case:
    w = _float(n, k, seed)
    q = quantize_minmax(w, group) if k % group == 0 else _minmax_tail(w, group)
    offset = 0 if v2 else -1
    planes = {
        f"{PREFIX}.qweight": pack_along_rows(q["q"], 4),
        f"{PREFIX}.qzeros": pack_along_columns(q["zeros"] + offset, 4),
        f"{PREFIX}.scales": q["scales"],
        f"{PREFIX}.g_idx": (np.arange(k) // group).astype(np.int32),
    }
    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False}
    if v2:
        config["checkpoint_format"] = "gptq_v2"
    weight = _only(infer_safetensors({"quantization_config": config}, inventory(planes)))
    return _finish("gptq_v2" if v2 else "gptq", weight, planes, w)


def _minmax_tail(w: np.ndarray, group: int) -> dict[str, Any]:
    """Min-max quantization with a last, partial group (pads K to whole groups, then cuts)."""
    k = w.shape[1]
    padded = np.concatenate([w, np.repeat(w[:, -1:], -k % group, axis=1)], axis=1)
    q = quantize_minmax(padded, group)
    return {**q, "q": q["q"][:k]}


def awq(n: int, k: int, group: int, seed: int = 1) -> Case:
    w = _float(n, k, seed)
    q = quantize_minmax(w, group)
    planes = {
        f"{PREFIX}.qweight": pack_along_columns(q["q"], 4, AWQ_ORDER),
        f"{PREFIX}.qzeros": pack_along_columns(q["zeros"], 4, AWQ_ORDER),
        f"{PREFIX}.scales": q["scales"],
    }
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    weight = _only(infer_safetensors({"quantization_config": config}, inventory(planes)))
    return _finish("awq", weight, planes, w)


_CT_DTYPE = {
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
}


def compressed_tensors(
    n: int,
    k: int,
    group: int,
    seed: int = 2,
    *,
    symmetric: bool = True,
    dtype: torch.dtype = torch.float16,
    bits: int = 4,
    strategy: str = "group",
) -> Case:
    import compressed_tensors.compressors.pack_quantized.base as pack
    import compressed_tensors.quantization as quantization

    generator = torch.Generator().manual_seed(seed)
    args: dict[str, Any] = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
    if strategy == "group":
        args["group_size"] = group
    groups = k // group if strategy == "group" else 1
    qmax = (1 << (bits - 1)) - 1
    scheme = quantization.QuantizationScheme(
        targets=["Linear"], weights=quantization.QuantizationArgs(**args)
    )
    weight = torch.randn(n, k, generator=generator)
    scale = (weight.reshape(n, groups, -1).abs().amax(-1) / qmax + 1e-3).to(dtype)
    state = {"weight": weight.to(dtype), "weight_scale": scale}
    if not symmetric:
        state["weight_zero_point"] = torch.randint(-3, 3, (n, groups), generator=generator, dtype=torch.int8)
    compressed = pack.PackedQuantizationCompressor.compress(state, scheme)

    def as_numpy(t: torch.Tensor) -> np.ndarray:
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

    planes = {f"{PREFIX}.{leaf}": as_numpy(t) for leaf, t in compressed.items()}
    infos = {
        f"{PREFIX}.{leaf}": TensorInfo(f"{PREFIX}.{leaf}", _CT_DTYPE[t.dtype], tuple(t.shape))
        for leaf, t in compressed.items()
    }
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args}},
        }
    }
    shape_values = {f"{PREFIX}.weight_shape": compressed["weight_shape"].tolist()}
    logical = _only(infer_safetensors(config, infos, shape_values=shape_values))
    label = f"ct{bits}_{strategy}_{'sym' if symmetric else 'asym'}_{str(dtype).rsplit('.', 1)[-1]}"
    return _finish(label, logical, planes, weight.numpy())


def _random_blocks(ggml_type: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random block bytes with finite binary16 super-scales (gguf-py cannot quantize K-quants)."""
    block, size = BLOCK_SIZES[ggml_type]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for offset in {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[ggml_type]:
        halves = (rng.standard_normal((n, k // block, 1)) * 0.05).astype("<f2")
        raw[:, :, offset : offset + 2] = halves.view(np.uint8)
    return raw.reshape(n, -1)


def gguf(ggml_type: str, n: int, k: int, seed: int = 3) -> Case:
    w = _float(n, k, seed)
    if ggml_type in ("Q4_K", "Q5_K", "Q6_K"):
        data = _random_blocks(ggml_type, n, k, np.random.default_rng(seed))
        w = quants.dequantize(data, GGMLQuantizationType[ggml_type]).astype(np.float32)
    else:
        data = quants.quantize(w, GGMLQuantizationType[ggml_type])
    tensor = "blk.0.ffn_down.weight"
    weights = infer_gguf({"general.architecture": "llama"}, [TensorInfo(tensor, ggml_type, (n, k))])
    weight = next(x for x in weights if x.name == tensor)
    return _finish(f"gguf_{ggml_type}", weight, {tensor: data}, w)


def splits(extent: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """``parts`` ranges covering ``extent``, each boundary a multiple of ``unit`` (as placement aligns)."""
    units = -(-extent // unit)
    cuts = [min(extent, round(units * i / parts) * unit) for i in range(parts + 1)]
    cuts[-1] = extent
    return list(itertools.pairwise(cuts))


def _cut(array: np.ndarray, axes: tuple[str, ...], ranges: dict[str, tuple[int, int]]) -> np.ndarray:
    index = tuple(slice(*ranges[a]) if a in ranges else slice(None) for a in axes)
    return np.ascontiguousarray(array[index])


def slice_planes(case: Case, bounds: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    """The planes of the rank owning ``bounds`` (logical N and K ranges), cut in each plane's own units."""
    c = case.weight.contract
    (n0, n1), (k0, k1) = bounds["N"], bounds["K"]
    if isinstance(c, GgufBlockContract):
        block, size = BLOCK_SIZES[c.ggml_type]
        data = case.planes[c.plane]
        return {c.plane: np.ascontiguousarray(data[n0:n1, k0 // block * size : k1 // block * size])}
    assert isinstance(c, AffineIntContract)
    out = {}
    group = c.scales.group_size
    act_order = isinstance(c.group_map, GroupMapIndex) and not c.group_map.sequential
    g_range = (0, c.scales.group_count) if act_order else (k0 // group, -(-k1 // group))

    def packed(extent_range: tuple[int, int], bits: int, axis: str, pack_axis: str) -> tuple[int, int]:
        if axis != pack_axis:
            return extent_range
        per = 32 // bits
        return extent_range[0] // per, -(-extent_range[1] // per)

    for tensor, role in contract_planes(c).items():
        array = case.planes[tensor]
        if role == "codes":
            axes = c.codes.physical_axes
            pa = c.codes.packing.axis
            ranges = {a: packed({"N": (n0, n1), "K": (k0, k1)}[a], c.codes.bits, a, pa) for a in axes}
        elif role == "scale":
            axes = c.scales.physical_axes
            ranges = {"N": (n0, n1), "G": g_range}
        elif role == "zero":
            zero = c.zero_point
            axes = zero.physical_axes
            pa = zero.packing.axis if isinstance(zero, ZeroIntPlane) else "none"
            bits = zero.bits if isinstance(zero, ZeroIntPlane) else 32
            ranges = {a: packed({"N": (n0, n1), "G": g_range}[a], bits, a, pa) for a in axes}
        elif role == "g_idx":
            axes, ranges = ("K",), {"K": (k0, k1)}
        else:
            axes, ranges = tuple("X" * array.ndim), {}
        out[tensor] = _cut(array, axes, ranges)
    return out


def rank_bounds(case: Case, tp: int, split: str, unit: int) -> list[dict[str, tuple[int, int]]]:
    """The logical slice of every rank: ``split`` "column" cuts N, "row" cuts K (at ``unit``)."""
    n, k = case.weight.shape.extents
    if split == "column":
        return [{"N": r, "K": (0, k)} for r in splits(n, tp, unit)]
    return [{"N": (0, n), "K": r} for r in splits(k, tp, unit)]


def under_isa(script: str, isa: str) -> str:
    """Stdout of ``tests/kernels/<script>`` run with torch forced to ``ATEN_CPU_CAPABILITY=isa``."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script))],
        env={"ATEN_CPU_CAPABILITY": isa, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    return out.stdout
