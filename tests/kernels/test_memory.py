"""Resident memory: no persistent full-size float copy of a quantized weight after preparation."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import FallbackPolicy, default_catalog, dispatch, rank_weight


def _held(prepared) -> list[torch.Tensor | np.ndarray]:
    return [v for v in vars(prepared).values() if isinstance(v, torch.Tensor | np.ndarray)]


def _nbytes(a) -> int:
    return a.numel() * a.element_size() if isinstance(a, torch.Tensor) else a.nbytes


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("bfloat16", 2)])
def test_int4_holds_only_packed_codes_and_scale_zero_pairs(dtype, size):
    n = k = 1024
    case = kc.gptq(n, k, 128)
    weight = rank_weight(case.weight, case.planes)
    prepared, _ = dispatch(  # int4pack named: in float32 it is on its slow path, not first by default
        weight, default_catalog(), activation_dtype=dtype, phase="decode", preferred=["cpu.int4pack"]
    )
    groups = k // 128
    assert prepared.resident_bytes == n * k // 2 + groups * n * 2 * size
    assert prepared.resident_bytes == sum(_nbytes(a) for a in _held(prepared))
    for a in _held(prepared):  # nothing it keeps is a float tensor of the weight's size
        assert not (a.dtype.is_floating_point if isinstance(a, torch.Tensor) else a.dtype.kind == "f") or (
            _nbytes(a) < n * k
        )
    bf16_equivalent = n * k * 2
    assert prepared.resident_bytes <= 0.3 * bf16_equivalent
    # against the ledger: the planes the loader read (codes, fp16 scales, packed zeros, g_idx)
    assert prepared.resident_bytes <= weight.plane_bytes + groups * n * 2 * size


def test_full_dequant_reports_its_float_copy():
    n = k = 256
    case = kc.gptq(n, k, 16)
    weight = rank_weight(case.weight, case.planes)
    prepared, trace = dispatch(
        weight,
        default_catalog(),
        activation_dtype="float32",
        phase="decode",
        policy=FallbackPolicy.from_cli("allow"),
        preferred=["full-dequant"],  # cpu.int4-direct takes group 16 without a float copy
    )
    assert trace.transformation == "full-dequant"
    assert prepared.resident_bytes == n * k * 4 > weight.plane_bytes


def _rss() -> int:
    """VmRSS after returning freed heap pages to the OS (glibc keeps freed chunks below its threshold)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_process_memory_after_preparation_is_the_packed_size():
    n = k = 2048
    case = kc.gptq(n, k, 128)
    weight = rank_weight(case.weight, case.planes)
    dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode")  # warm up allocators
    gc.collect()
    before = _rss()
    prepared, _ = dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode")
    gc.collect()
    grown = _rss() - before
    float_copy = n * k * 4
    assert prepared.resident_bytes < 0.15 * float_copy
    assert grown < 0.5 * float_copy, (grown, prepared.resident_bytes)
