"""Dispatch: fallback policy, required/preferred kernels, per-phase selection, and the trace as data."""

from __future__ import annotations

import json

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import (
    Catalog,
    DispatchTrace,
    FallbackPolicy,
    FallbackWarning,
    default_catalog,
    dispatch,
    dispatch_phases,
    rank_weight,
)
from shardport.kernels.admission import Reason
from shardport.kernels.errors import FallbackForbiddenError, NoAdmissibleKernelError
from shardport.kernels.int4_cpu import CAPABILITY as INT4
from shardport.kernels.int4_cpu import Int4CpuKernel
from shardport.kernels.reference import FullDequantKernel, ReferenceKernel
from shardport.registry.contracts import decode_weight


@pytest.fixture(scope="module")
def g16():
    """GPTQ with group 16: no packed kernel takes it (int4pack groups are 32..256)."""
    case = kc.gptq(64, 256, 16)
    return rank_weight(case.weight, case.planes)


def _packed_only():
    """The default catalog without ``cpu.int4-direct`` (which takes any group size): g16 then has no
    kernel but the fallbacks, which is what the policy tests below need."""
    return Catalog([k for k in default_catalog() if k.capability.id != "cpu.int4-direct"])


def test_g16_needs_no_fallback_with_the_direct_kernel(g16):
    _, trace = dispatch(g16, default_catalog(), activation_dtype="float32", phase="decode")
    assert trace.selected == "cpu.int4-direct@1" and trace.transformation == "none"
    assert trace.candidates[0].kernel == "cpu.int4-direct@1"  # float32: int4pack's slow path comes later
    (packed,) = [c for c in trace.candidates if c.kernel.startswith("cpu.int4pack")]
    assert packed.admission.reasons == (Reason.GROUP_SIZE,)  # int4pack: groups 32..256


@pytest.fixture(scope="module")
def gptq():
    case = kc.gptq(64, 256, 32)
    return rank_weight(case.weight, case.planes)


def test_forbid_fails_listing_every_candidates_reason(g16):
    with pytest.raises(NoAdmissibleKernelError) as caught:
        dispatch(g16, _packed_only(), activation_dtype="float32", phase="decode")
    message = str(caught.value)
    assert isinstance(caught.value, FallbackForbiddenError)  # only the policy stood in the way
    assert "cpu.int4pack@1: refused (group_size: expected one of [32, 64, 128, 256], found 16)" in message
    assert "full-dequant@1: refused (policy" in message and "reference@1: refused (policy" in message
    assert "--fallback allow" in message and "N=0:64, K=0:256" in message


def test_allow_runs_and_the_trace_says_full_dequant(g16):
    prepared, trace = dispatch(
        g16,
        _packed_only(),
        activation_dtype="float32",
        phase="decode",
        policy=FallbackPolicy.from_cli("allow"),
    )
    assert trace.selected == "full-dequant@1" and trace.transformation == "full-dequant"
    # float32: the packed CPU kernels are on their slow path, so they come after the fast ones (and
    # before the fallback classes)
    assert [c.kernel for c in trace.candidates] == [
        "cpu.gguf-direct@1",
        "cuda.int4-tinygemm@1",
        "cpu.int4pack@1",
        "cpu.int8pack@1",
        "full-dequant@1",
        "reference@1",
    ]
    assert trace.candidates[0].admission.reasons == (Reason.LAYOUT,)
    assert Reason.DEVICE in trace.candidates[1].admission.reasons
    assert trace.candidates[2].admission.reasons == (Reason.GROUP_SIZE,)
    assert Reason.LAYOUT in trace.candidates[3].admission.reasons
    assert [c.note is not None for c in trace.candidates] == [False, False, True, True, False, False]
    assert trace.candidates[4].selected and trace.candidates[5].admission.accepted
    assert not trace.candidates[5].prepared  # admitted for the trace, not prepared
    x = torch.randn(3, 256)
    reference = decode_weight(g16.local_weight, g16.named_planes)
    assert torch.allclose(prepared(x), x @ torch.from_numpy(reference).T, rtol=1e-5, atol=1e-5)


def test_warn_runs_with_a_warning_recorded_in_the_trace(g16):
    with pytest.warns(FallbackWarning, match="full-dequant"):
        _, trace = dispatch(
            g16,
            _packed_only(),
            activation_dtype="float32",
            phase="decode",
            policy=FallbackPolicy.from_cli("warn"),
        )
    assert trace.warnings and "full-dequant" in trace.warnings[0]


def test_no_admissible_kernel_at_all_is_not_a_policy_error(g16):
    catalog = Catalog([Int4CpuKernel()])
    with pytest.raises(NoAdmissibleKernelError) as caught:
        dispatch(
            g16, catalog, activation_dtype="float32", phase="decode", policy=FallbackPolicy.from_cli("allow")
        )
    assert not isinstance(caught.value, FallbackForbiddenError)
    assert "group_size" in str(caught.value)


def test_required_and_preferred(gptq):
    allow = FallbackPolicy.from_cli("allow")
    _, trace = dispatch(
        gptq,
        default_catalog(),
        activation_dtype="float32",
        phase="decode",
        required=["reference"],
        policy=allow,
    )
    assert trace.selected == "reference@1"
    (int4,) = [c for c in trace.candidates if c.kernel == "cpu.int4pack@1"]  # admissible but not required
    assert int4.admission.reasons == (Reason.NOT_REQUIRED,)
    _, trace = dispatch(
        gptq,
        default_catalog(),
        activation_dtype="float32",
        phase="decode",
        preferred=["full-dequant"],
        policy=allow,
    )
    assert trace.selected == "full-dequant@1" and trace.candidates[0].kernel == "full-dequant@1"
    with pytest.raises(FallbackForbiddenError):  # required, but the policy forbids full dequant
        dispatch(
            gptq, default_catalog(), activation_dtype="float32", phase="decode", required=["reference@1"]
        )


class DecodeOnlyInt4(Int4CpuKernel):
    """The int4 kernel declared for decode only (as a GEMV-tuned kernel would be)."""

    capability = INT4.model_copy(update={"id": "cpu.int4pack-gemv", "phases": ("decode",)})


def test_prefill_and_decode_may_select_different_kernels(gptq):
    catalog = Catalog([DecodeOnlyInt4(), FullDequantKernel(), ReferenceKernel()])
    chosen = dispatch_phases(
        gptq, catalog, activation_dtype="float32", policy=FallbackPolicy.from_cli("allow")
    )
    assert chosen["decode"][1].selected == "cpu.int4pack-gemv@1"
    assert chosen["prefill"][1].selected == "full-dequant@1"
    assert chosen["prefill"][1].candidates[0].admission.reasons == (Reason.PHASE,)


def test_one_prepared_operator_serves_both_phases_when_the_same_kernel_wins(gptq):
    chosen = dispatch_phases(gptq, default_catalog(), activation_dtype="bfloat16")
    assert chosen["prefill"][0] is chosen["decode"][0]
    assert chosen["prefill"][1].selected == chosen["decode"][1].selected == "cpu.int4pack@1"


def test_trace_is_plain_data(gptq):
    _, trace = dispatch(gptq, default_catalog(), activation_dtype="bfloat16", phase="decode")
    raw = trace.model_dump_json()
    again = DispatchTrace.model_validate_json(raw)
    assert again == trace
    data = json.loads(raw)
    assert data["requested"]["layout"] == "affine:u4:slots32@K:KN:01234567"
    assert data["requested"]["device"]["kind"] == "cpu" and data["transformation"] == "conversion"


def test_act_order_k_slice_is_refused_at_preparation_by_the_reference():
    case = kc.gptq(64, 256, 32)
    rng = np.random.default_rng(0)
    order = rng.permutation(256)
    planes = dict(case.planes)
    planes[f"{kc.PREFIX}.g_idx"] = (order // 32).astype(np.int32)
    group_map = case.weight.contract.group_map.model_copy(update={"sequential": False})
    weight = case.weight.model_copy(
        update={"contract": case.weight.contract.model_copy(update={"group_map": group_map}), "witness": None}
    )
    full = rank_weight(weight, planes)
    _, trace = dispatch(
        full,
        default_catalog(),
        activation_dtype="float32",
        phase="decode",
        required=["reference"],
        policy=FallbackPolicy.from_cli("allow"),
    )
    assert trace.selected == "reference@1"
    bounds = {"N": (0, 64), "K": (128, 256)}
    part = {k: (v[128:] if k.endswith("g_idx") else v) for k, v in planes.items()}
    part[f"{kc.PREFIX}.qweight"] = planes[f"{kc.PREFIX}.qweight"][16:]
    with pytest.raises(NoAdmissibleKernelError, match="prepare"):
        dispatch(
            rank_weight(weight, part, bounds),
            default_catalog(),
            activation_dtype="float32",
            phase="decode",
            required=["reference"],
            policy=FallbackPolicy.from_cli("allow"),
        )
