"""The int8 weight-only and direct GGUF block kernels as catalog kernels: admission, dispatch, parity."""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import (
    Device,
    admit,
    default_catalog,
    dispatch,
    ladder,
    operator_signature,
    rank_weight,
    require,
)
from shardport.kernels.admission import Reason
from shardport.kernels.gguf_kernel import CAPABILITY as GGUF_DIRECT
from shardport.kernels.int8_kernel import CAPABILITY as INT8

CPU = Device(kind="cpu", isa="AVX512")
N, K = 64, 256


def _op(case, bounds=None, dtype="float32"):
    planes = kc.slice_planes(case, bounds) if bounds else case.planes
    return operator_signature(rank_weight(case.weight, planes, bounds), dtype, "decode", CPU)


CASES = {
    "ct8_channel": lambda: kc.compressed_tensors(N, K, K, bits=8, strategy="channel", dtype=torch.float32),
    "ct8_group": lambda: kc.compressed_tensors(N, K, 32, bits=8, dtype=torch.bfloat16),
    "ct8_channel_asym": lambda: kc.compressed_tensors(
        N, K, K, bits=8, strategy="channel", symmetric=False, dtype=torch.float32
    ),
    "gptq": lambda: kc.gptq(N, K, 32),
    "q8_0": lambda: kc.gguf("Q8_0", N, K),
    "q4_0": lambda: kc.gguf("Q4_0", N, K),
    "q4_k": lambda: kc.gguf("Q4_K", N, K),
    "q6_k": lambda: kc.gguf("Q6_K", N, K),
}
INT8_EXPECTED = {
    "ct8_channel": (),
    "ct8_group": (Reason.GROUP_SIZE,),
    "ct8_channel_asym": (Reason.ZERO_POINT,),
    "gptq": (Reason.LAYOUT,),
    "q8_0": (Reason.GROUP_SIZE,),
    "q4_0": (Reason.LAYOUT,),
    "q4_k": (Reason.LAYOUT,),
    "q6_k": (Reason.LAYOUT,),
}
GGUF_EXPECTED = {name: (() if name.startswith("q") else (Reason.LAYOUT,)) for name in CASES}


@pytest.fixture(scope="module")
def cases():
    return {name: build() for name, build in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_int8_and_gguf_direct_tables(cases, name):
    assert admit(_op(cases[name]), INT8).reasons == INT8_EXPECTED[name], str(admit(_op(cases[name]), INT8))
    assert admit(_op(cases[name]), GGUF_DIRECT).reasons == GGUF_EXPECTED[name]


def test_q8_0_per_32_blocks_are_refused_by_int8_with_the_reason(cases):
    verdict = admit(_op(cases["q8_0"]), INT8)
    assert str(verdict) == (
        "cpu.int8pack@1: refused (group_size: expected one scale per row (a group of all "
        "K_local=256 columns), found 8 groups of 32 along K per row)"
    )


def test_q8_0_dispatches_to_the_direct_block_kernel(cases):
    weight = rank_weight(cases["q8_0"].weight, cases["q8_0"].planes)
    _, trace = dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode")
    assert trace.selected == "cpu.gguf-direct@1" and trace.transformation == "none"
    reasons = {c.kernel: c.admission.reasons for c in trace.candidates}
    assert reasons["cpu.int4pack@1"] == (Reason.LAYOUT,) and reasons["cpu.int8pack@1"] == (Reason.GROUP_SIZE,)


def _ladder(case, bounds, dtype, expect):
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    prepared, trace = dispatch(weight, default_catalog(), activation_dtype=dtype, phase="decode")
    assert trace.selected == expect, [str(c.admission) for c in trace.candidates]
    rng = np.random.default_rng(0)
    xs = (
        rng.standard_normal((1, weight.k_local)).astype(np.float32),
        rng.standard_normal((64, weight.k_local)).astype(np.float32),
    )
    result = require(
        ladder(prepared, weight, manifest_digest="sha256:" + "1" * 64, verified_tiles=2, activations=xs)
    )
    return prepared, weight, result


@pytest.mark.parametrize("name", ["q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize(("tp", "split"), [(1, "column"), (2, "column"), (3, "row")])
def test_gguf_direct_parity_on_rank_slices(cases, name, tp, split):
    case = cases[name]
    unit = 256 if name != "q8_0" else 32
    witnessed = 0
    for bounds in kc.rank_bounds(case, tp, split, unit if split == "row" else 8):
        if bounds["K"][1] == bounds["K"][0]:
            continue
        prepared, weight, result = _ladder(case, bounds, "float32", "cpu.gguf-direct@1")
        assert result.l2.exact and result.l1.readback == "kernel-values" and result.l1.mismatches == 0
        assert result.l1.codes_compared == weight.n_local * result.l1.columns > 0
        assert prepared.resident_bytes == weight.plane_bytes  # the blocks as loaded, no float copy
        witnessed += result.l2.witness_checked
    assert witnessed > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tp", [1, 2, 3])
def test_int8_parity_on_column_slices(cases, dtype, tp):
    case = cases["ct8_channel"]
    for bounds in kc.rank_bounds(case, tp, "column", 8):
        prepared, weight, result = _ladder(case, bounds, dtype, "cpu.int8pack@1")
        assert result.l1.applicable and result.l1.mismatches == 0
        assert result.l2.exact == (dtype == "float32")
        size = 4 if dtype == "float32" else 2
        assert prepared.resident_bytes == weight.n_local * weight.k_local + weight.n_local * size
