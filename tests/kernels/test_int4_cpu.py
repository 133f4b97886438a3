"""CPU packed int4: parity L1-L3 on rank-local slices at tp 1, 2, 3, and the hazards caught before a call."""

from __future__ import annotations

import pickle

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import FallbackPolicy, default_catalog, dispatch, ladder, rank_weight, require
from shardport.kernels.errors import (
    IsaMismatchError,
    KernelInputError,
    NotPersistableError,
    RankWeightError,
)
from shardport.kernels.int4_cpu import Int4CpuKernel

N = K = 384
TOL_QUANT = 0.2  # 4-bit min-max / absmax quantization of a Gaussian weight: ~0.1 relative output error

BUILDERS = {
    "gptq": lambda: kc.gptq(N, K, 32),
    "gptq_g128": lambda: kc.gptq(N, K, 128),
    "awq": lambda: kc.awq(N, K, 64),
    "ct_sym": lambda: kc.compressed_tensors(N, K, 32),
    "ct_asym": lambda: kc.compressed_tensors(N, K, 32, symmetric=False),
    "q4_0": lambda: kc.gguf("Q4_0", N, K),
    "q4_1": lambda: kc.gguf("Q4_1", N, K),
}
# exact in float32 (codes and scales only permuted) vs a conversion with a recorded error
# (compressed-tensors' decode law rounds every product to the scale format; int4pack does not)
EXACT_F32 = {
    "gptq": True,
    "gptq_g128": True,
    "awq": True,
    "ct_sym": False,
    "ct_asym": False,
    "q4_0": True,
    "q4_1": True,
}


@pytest.fixture(scope="module")
def cases():
    return {name: build() for name, build in BUILDERS.items()}


def _activations(k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(k)
    return rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal((64, k)).astype(np.float32)


def _dispatch(weight, dtype, **kwargs):
    """Dispatch preferring int4pack: in float32 (its slow path) it otherwise comes after gguf-direct."""
    return dispatch(
        weight,
        default_catalog(),
        activation_dtype=dtype,
        phase="decode",
        preferred=["cpu.int4pack"],
        **kwargs,
    )


def _run_ladder(case, bounds, dtype="float32", *, with_float=True):
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    prepared, trace = _dispatch(weight, dtype)
    assert trace.selected == "cpu.int4pack@1", [str(c.admission) for c in trace.candidates]
    float_slice = case.float_weight[slice(*bounds["N"]), slice(*bounds["K"])]
    result = ladder(
        prepared,
        weight,
        manifest_digest="sha256:" + "0" * 64,
        verified_tiles=1,
        activations=_activations(weight.k_local),
        float_weight=float_slice if with_float else None,
        tol_quant=TOL_QUANT,
    )
    return require(result), trace


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize(
    ("tp", "split"), [(1, "column"), (2, "column"), (3, "column"), (2, "row"), (3, "row")]
)
def test_parity_ladder_on_rank_slices(cases, name, tp, split):
    case = cases[name]
    contract = case.weight.contract
    unit = getattr(getattr(contract, "scales", None), "group_size", 32) if split == "row" else 16
    witnessed = 0
    for bounds in kc.rank_bounds(case, tp, split, unit):
        result, trace = _run_ladder(case, bounds)
        assert result.l1.applicable and result.l1.mismatches == 0 and result.l1.codes_compared > 0
        assert result.l2.exact == EXACT_F32[name]
        assert trace.transformation == ("repack" if EXACT_F32[name] else "conversion")
        assert [x.tokens for x in result.l3] == [1, 64]
        assert all(x.e_quant is not None and x.e_quant <= TOL_QUANT for x in result.l3)
        witnessed += result.l2.witness_checked
    assert witnessed > 0  # the witness cells every split meets were re-digested from the layout


@pytest.mark.parametrize("name", ["gptq", "ct_sym", "q4_1"])
def test_bfloat16_is_a_conversion_with_its_error_recorded(cases, name):
    case = cases[name]
    n, k = case.weight.shape.extents
    result, trace = _run_ladder(case, {"N": (0, n), "K": (0, k)}, dtype="bfloat16")
    assert trace.transformation == "conversion" and trace.conversion_error > 0
    assert result.l1.mismatches == 0 and result.l1.representation == "conversion"
    assert not result.l2.exact and result.l2.max_abs_error <= result.l2.tolerance
    # each element within its own bound, from the planes' terms and bfloat16's rounding, not the
    # measured error (which L2 only records)
    assert 0 < result.l2.error_over_budget <= 1 and "in bfloat16" in result.l2.tolerance_source
    assert result.l2.max_abs_error == trace.conversion_error
    assert result.l2.witness_passed and result.l2.witness_checked > 0


def test_compressed_tensors_bf16_scales_round_per_law_so_float32_is_a_conversion():
    case = kc.compressed_tensors(64, 256, 32, dtype=torch.bfloat16)
    result, trace = _run_ladder(case, {"N": (0, 64), "K": (0, 256)})
    assert trace.transformation == "conversion"
    assert result.l2.max_abs_error == trace.conversion_error > 0
    # the law rounds each product to bfloat16 and int4pack does not: budget 2^-8·|w| per element
    assert result.l2.error_over_budget <= 1 and "+ 2^-8)·|w|" in result.l2.tolerance_source


def _prepare(case, dtype="float32"):
    weight = rank_weight(case.weight, case.planes)
    prepared, _ = _dispatch(weight, dtype)
    return weight, prepared


def test_out_of_range_code_is_refused_before_the_kernel(cases):
    case = cases["ct_sym"]
    weight = rank_weight(case.weight, case.planes)
    op = _prepare(case)[1].op
    # an unpacked-container variant: codes one per int32, so a value of 17 is storable
    contract = weight.contract
    plain = contract.codes.packing.model_copy(update={"axis": "none", "slot_order": (0,), "scheme": "slots"})
    codes = np.zeros((64, 256), dtype=np.int32)
    codes[3, 5] = 17
    local = weight.weight.model_copy(
        update={
            "shape": weight.weight.shape.model_copy(update={"extents": (64, 256)}),
            "contract": contract.model_copy(
                update={
                    "codes": contract.codes.model_copy(
                        update={"packing": plain, "encoding": "u4", "physical_shape": (64, 256)}
                    ),
                    "scales": contract.scales.model_copy(update={"physical_shape": (64, 8)}),
                }
            ),
        }
    )
    planes = {contract.codes.plane: codes, contract.scales.plane: np.ones((64, 8), dtype=np.float16)}
    with pytest.raises(KernelInputError, match=r"row 3 column 5.*17"):
        Int4CpuKernel().prepare(rank_weight(local, planes), op.model_copy(update={"n_local": 64}))


def test_short_scale_plane_is_refused(cases):
    case = cases["gptq"]
    planes = dict(case.planes)
    scales = f"{kc.PREFIX}.scales"
    planes[scales] = planes[scales][:-1]  # one group short: int4pack would read past the end
    with pytest.raises(RankWeightError, match="scales shape"):
        rank_weight(case.weight, planes)


def test_slice_starting_inside_a_group_is_refused(cases):
    case = cases["gptq_g128"]
    bounds = {"N": (0, N), "K": (64, 320)}
    with pytest.raises(RankWeightError, match="multiple of the group size 128"):
        rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)


def test_packed_layout_is_keyed_by_isa_and_never_persisted(cases):
    _, prepared = _prepare(cases["q4_0"])
    with pytest.raises(NotPersistableError):
        pickle.dumps(prepared)
    x = torch.randn(2, K)
    expected = prepared(x)
    prepared.isa = "AVX2" if prepared.isa != "AVX2" else "AVX512"  # as if packed on another machine
    with pytest.raises(IsaMismatchError, match="ISA"):
        prepared(x)
    with pytest.raises(IsaMismatchError):
        prepared.probe_codes()
    assert expected.shape == (2, N)


@pytest.mark.slow
def test_packed_bytes_differ_per_isa_and_each_isa_reads_its_own():
    """Under ATEN_CPU_CAPABILITY avx2 and default codes pack to different bytes; L1 passes in each."""
    digests = {}
    for isa in ("avx2", "default"):
        out = kc.under_isa("isa_probe.py", isa)
        capability, digest, l1 = out.split()
        assert l1 == "L1=ok", out
        digests[capability] = digest
    assert len(set(digests.values())) == 2, digests


def test_activation_dtype_mismatch_is_a_typed_error(cases):
    from shardport.kernels.errors import ActivationError

    _, prepared = _prepare(cases["awq"])
    with pytest.raises(ActivationError, match="float32"):
        prepared(torch.randn(1, K, dtype=torch.bfloat16))
    with pytest.raises(ActivationError):
        prepared(torch.randn(1, K - 32))


def test_policy_forbidding_conversion_moves_to_the_next_candidate(cases):
    weight = rank_weight(cases["gptq"].weight, cases["gptq"].planes)
    strict = FallbackPolicy(conversion="forbid", full_dequant="allow")
    _, trace = dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode", policy=strict)
    first = trace.candidates[0]
    assert first.kernel == "cpu.int4pack@1" and first.prepared and not first.selected
    assert "conversion" in str(first.admission)
    # the direct int4 kernel decodes exactly and multiplies in float32: no conversion, no fallback
    assert trace.selected == "cpu.int4-direct@1" and trace.transformation == "none"


def test_twos_complement_codes_take_the_fast_unpack_and_match_the_oracle(cases):
    case = cases["ct_sym"]
    contract = case.weight.contract
    twos = contract.model_copy(update={"codes": contract.codes.model_copy(update={"encoding": "s4_twos"})})
    weight = case.weight.model_copy(update={"contract": twos, "witness": None})
    for bounds in kc.rank_bounds(case, 2, "row", 32):
        twos_case = kc.Case("twos", weight, case.planes, case.float_weight)
        result, trace = _run_ladder(twos_case, bounds, with_float=False)  # the floats mean other codes
        assert result.l1.mismatches == 0 and trace.requested.code_encoding == "s4_twos"
