"""Every ladder row can fail: a mis-scaled conversion fails L2 and L3, corrupted stored codes fail a direct
kernel's L1, and L1 is "not applicable" with its reason only where nothing can be read back.

Real kernels on small weights (N = K = 128); the faults are injected into a prepared layout the way a
wrong packer or a corrupted plane would leave it, and the preparation's own measurement re-run on it.
"""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import Catalog, FallbackPolicy, dispatch, int4_direct, ladder, rank_weight
from shardport.kernels.errors import FallbackForbiddenError, ParityError
from shardport.kernels.gguf_kernel import GgufDirectKernel
from shardport.kernels.int4_cpu import Int4CpuKernel, PreparedInt4, int4_terms
from shardport.kernels.int4_direct import Int4DirectKernel
from shardport.kernels.int8_kernel import Int8CpuKernel
from shardport.kernels.parity import ladder_sampled, require, spot_columns
from shardport.kernels.parity_codes import spot_rows
from shardport.kernels.reference import FullDequantKernel, ReferenceKernel

N = K = 128
DIGEST = "sha256:" + "2" * 64


@pytest.fixture(scope="module")
def cases() -> dict[str, kc.Case]:
    return {
        "gptq": kc.gptq(N, K, 32),
        "ct8": kc.compressed_tensors(N, K, K, bits=8, strategy="channel", dtype=torch.float32),
        "q8_0": kc.gguf("Q8_0", N, K),
    }


def _weight(case: kc.Case):
    return rank_weight(case.weight, case.planes)


def _op(kernel, weight, dtype: str):
    """``kernel`` prepared for ``weight`` as dispatch would, the policy letting every class through."""
    prepared, _ = dispatch(
        weight,
        Catalog([kernel]),
        activation_dtype=dtype,
        phase="prefill",
        policy=FallbackPolicy.from_cli("allow"),
    )
    return prepared


def _ladder(prepared, weight):
    rng = np.random.default_rng(11)
    xs = (rng.standard_normal((1, K)).astype(np.float32), rng.standard_normal((16, K)).astype(np.float32))
    return ladder(prepared, weight, manifest_digest=DIGEST, verified_tiles=1, activations=xs)


def _mis_scale(prepared: PreparedInt4, weight, factor: float) -> None:
    """A packer that scales every (scale, zero) by ``factor``: the layout, and what preparation measures."""
    prepared.scale_zero = (prepared.scale_zero.double() * factor).to(prepared.scale_zero.dtype)
    prepared._sz32 = None
    prepared.conversion_error = prepared._decode_error(int4_terms(weight))
    prepared.transformation = "conversion"  # as preparation labels a layout that is not exact


# -- L2 / L3: a conversion is held to its budget, never to its own measured error ---------------------


def test_a_mis_scaled_conversion_fails_l2_and_l3_with_the_number(cases):
    weight = _weight(cases["gptq"])
    prepared = _op(Int4CpuKernel(), weight, "float32")
    assert prepared.transformation == "repack" and prepared.conversion_error == 0.0
    _mis_scale(prepared, weight, 1.01)
    assert prepared.conversion_error > 0  # the old L2 tolerance: error <= this very number passed
    result = _ladder(prepared, weight)
    l2 = result.l2
    assert not l2.passed and l2.witness_passed  # the witness is the reference's: only the layout is off
    assert l2.max_abs_error == pytest.approx(prepared.conversion_error)
    assert l2.max_abs_error > l2.tolerance > 0 and l2.error_over_budget > 1e3
    assert "int4pack's (scale, zero) in float32" in l2.tolerance_source
    assert "not the measured error" in l2.tolerance_source
    assert l2.first_violation and "|Δ|" in l2.first_violation and "> bound" in l2.first_violation
    for x in result.l3:
        assert not x.passed
        assert x.e_kernel == pytest.approx(0.01, rel=0.05)  # the mis-scale itself
        assert x.tol_conversion < 1e-5 and x.e_kernel > x.tol_kernel + x.tol_conversion
        assert "KERNEL_TOLERANCE[cpu.int4pack][float32]" in x.tolerance_source
    with pytest.raises(ParityError, match="parity L2"):
        require(result)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_bfloat16_conversions_pass_their_budget_and_a_mis_scale_does_not(cases, factor):
    """int4pack (scale, zero) and int8pack's scales cast to bfloat16: legit within budget, 1 % off outside."""
    gptq, ct8 = _weight(cases["gptq"]), _weight(cases["ct8"])
    int4 = _op(Int4CpuKernel(), gptq, "bfloat16")
    int8 = _op(Int8CpuKernel(), ct8, "bfloat16")
    assert int4.transformation == int8.transformation == "conversion"
    if factor != 1.0:
        _mis_scale(int4, gptq, factor)
        int8.scales = (int8.scales.double() * factor).to(torch.bfloat16)
    for prepared, weight in ((int4, gptq), (int8, ct8)):
        l2 = _ladder(prepared, weight).l2
        assert l2.passed == (factor == 1.0), (prepared.kernel, l2)
        assert "bfloat16" in l2.tolerance_source
        if factor == 1.0:
            assert 0 < l2.max_abs_error and l2.error_over_budget <= 1.0
        else:
            assert l2.error_over_budget > 1.0 and l2.first_violation


def test_a_full_dequant_copy_is_held_to_the_rounding_of_its_dtype(cases):
    weight = _weight(cases["gptq"])
    prepared = _op(FullDequantKernel(), weight, "bfloat16")
    result = require(_ladder(prepared, weight))
    assert not result.l2.exact and result.l2.error_over_budget <= 1.0
    assert "a dense bfloat16 copy" in result.l2.tolerance_source
    prepared.dense.mul_(1.01)
    assert not _ladder(prepared, weight).l2.passed


# -- L1: a direct kernel reads its stored codes back; corrupted after preparation, L1 fails ------------


def test_int4_direct_l1_fails_when_its_stored_codes_are_corrupted_after_preparation(cases, monkeypatch):
    monkeypatch.setattr(int4_direct, "UNPACK_ROWS", 48)  # the oracle's unpacking in 3 row chunks
    weight = _weight(cases["gptq"])
    prepared = _op(Int4DirectKernel(), weight, "float32")
    clean = _ladder(prepared, weight).l1
    assert clean.passed and clean.applicable and clean.readback == "kernel-columns"
    assert clean.codes_compared == N * len(spot_columns(K)) and clean.mismatches == 0
    assert 0 in spot_columns(K)  # GPTQ qweight [K/8, N]: container line 0 holds K = 0..7
    corrupted = prepared.codes.clone()
    corrupted[0] ^= 0x11111111  # the low bit of every nibble of K 0..7, every row: every code changes
    prepared.codes = corrupted
    bad = _ladder(prepared, weight).l1
    assert not bad.passed and bad.mismatches >= N
    assert bad.first_mismatch is not None and bad.first_mismatch.startswith("row 0 column 0: code")


def test_gguf_direct_l1_fails_when_its_stored_blocks_are_corrupted_after_preparation(cases):
    weight = _weight(cases["q8_0"])
    prepared = _op(GgufDirectKernel(), weight, "bfloat16")  # read back in binary32 whatever the dtype
    clean = _ladder(prepared, weight).l1
    assert clean.passed and clean.readback == "kernel-values" and clean.mismatches == 0
    assert clean.codes_compared == N * len(spot_columns(K))
    blocks = prepared.blocks.copy()
    blocks[5, 2] ^= 0x01  # Q8_0: row 5, block 0, element 0's int8 code (bytes 0-1 are the scale)
    prepared.blocks = blocks
    bad = _ladder(prepared, weight).l1
    assert not bad.passed and bad.mismatches == 1
    assert bad.first_mismatch is not None and bad.first_mismatch.startswith("row 5 column 0: value")
    # a sampled ladder reads the spot columns on every 8th row (and the last): row 8 yes, row 5 not
    sampled = ladder_sampled(prepared, weight, manifest_digest=DIGEST, verified_tiles=1, represented_by="r")
    assert sampled.l1.passed and sampled.l1.rows == len(spot_rows(N)) == N // 8 + 1
    blocks[8, 2] ^= 0x01
    sampled = ladder_sampled(prepared, weight, manifest_digest=DIGEST, verified_tiles=1, represented_by="r")
    assert not sampled.l1.passed and sampled.l1.first_mismatch.startswith("row 8 column 0: value")


def test_l1_is_not_applicable_with_a_reason_only_where_nothing_is_read_back(cases):
    weight = _weight(cases["gptq"])
    read_back = {
        "reference": _ladder(_op(ReferenceKernel(), weight, "float32"), weight).l1,
        "full-dequant": _ladder(_op(FullDequantKernel(), weight, "float32"), weight).l1,
    }
    assert "reference decoder itself" in (read_back["reference"].reason or "")
    assert "dense float copy" in (read_back["full-dequant"].reason or "")
    for l1 in read_back.values():
        assert not l1.applicable and l1.codes_compared == 0 and l1.passed
    for kernel in (Int4CpuKernel(), Int4DirectKernel()):
        l1 = _ladder(_op(kernel, weight, "float32"), weight).l1
        assert l1.applicable and l1.reason is None and l1.codes_compared > 0


# -- --fallback forbid: a conversion is refused, with the reason ------------------------------------


def test_forbid_refuses_a_weight_whose_only_admissible_kernel_converts(cases):
    weight = _weight(cases["gptq"])
    forbid = FallbackPolicy.from_cli("forbid")
    assert forbid.conversion == forbid.generic == forbid.full_dequant == "forbid"
    assert (
        FallbackPolicy.from_cli("allow").conversion == FallbackPolicy.from_cli("warn").conversion == "allow"
    )
    with pytest.raises(FallbackForbiddenError) as caught:  # bfloat16 (scale, zero): a conversion
        dispatch(
            weight, Catalog([Int4CpuKernel()]), activation_dtype="bfloat16", phase="decode", policy=forbid
        )
    message = str(caught.value)
    assert "cpu.int4pack@1" in message and "policy" in message
    assert "conversion (max reconstruction error" in message
    _, trace = dispatch(
        weight, Catalog([Int4CpuKernel()]), activation_dtype="float32", phase="decode", policy=forbid
    )
    assert trace.transformation == "repack"  # float32: codes and scales only permuted, admitted
