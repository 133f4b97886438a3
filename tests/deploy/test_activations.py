"""``registry up --activations``: the cast around each operator, the float32 fallback said in the trace,
and the L4 / KV-cache tolerances that follow the dtype the operators ran in."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from shardport.deploy.rank_ops import (
    activations_for,
    cache_tolerance,
    operator_linear,
)
from shardport.deploy.report import render_report
from shardport.deploy.up_evidence import runtime_section, tolerance
from shardport.kernels import Catalog, RankWeight, Reason, default_catalog, dispatch_activations, rank_weight
from shardport.kernels.gguf_kernel import GgufDirectKernel
from shardport.kernels.int4_cpu import CAPABILITY as INT4
from shardport.kernels.int4_cpu import Int4CpuKernel
from shardport.kernels.reference import ReferenceKernel
from shardport.registry.contracts import TensorInfo, infer_gguf

N, K = 64, 256
TENSOR = "blk.0.ffn_down.weight"


@pytest.fixture(scope="module")
def q4_0() -> RankWeight:
    """A GGUF Q4_0 weight ``[64, 256]`` (cpu.int4pack takes it; cpu.gguf-direct too)."""
    w = (np.random.default_rng(0).standard_normal((N, K)) * 0.1).astype(np.float32)
    data = quants.quantize(w, GGMLQuantizationType.Q4_0)
    weights = infer_gguf({"general.architecture": "llama"}, [TensorInfo(TENSOR, "Q4_0", (N, K))])
    return rank_weight(next(x for x in weights if x.name == TENSOR), {TENSOR: data})


class Float32OnlyInt4(Int4CpuKernel):
    """torch's int4pack declared for float32 activations only (and fast there): a kernel that cannot
    take bfloat16."""

    capability = INT4.model_copy(
        update={"id": "cpu.int4pack-f32", "activation_dtypes": ("float32",), "slow_activations": ()}
    )


class SlowFloat32OnlyInt4(Int4CpuKernel):
    """The same, declared slow in float32 (as torch's int4pack is)."""

    capability = INT4.model_copy(update={"id": "cpu.int4pack-f32", "activation_dtypes": ("float32",)})


def test_operator_linear_casts_to_the_operators_dtype_and_back_to_float32(q4_0: RankWeight) -> None:
    op16 = dispatch_activations(q4_0, default_catalog(), "bfloat16")["prefill"][0]
    op32 = dispatch_activations(q4_0, default_catalog(), "float32")["decode"][0]
    # int4pack in bfloat16 (its fast path); in float32 the direct block kernel (int4pack's slow path)
    assert (op16.kernel, op32.kernel) == ("cpu.int4pack@1", "cpu.gguf-direct@1")
    assert (op16.op.activation_dtype, op32.op.activation_dtype) == ("bfloat16", "float32")
    linear = operator_linear({"prefill": op16, "decode": op32})
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    kept = x.clone()
    y = linear(x)  # three tokens: the prefill operator, in bfloat16
    assert y.dtype == torch.float32 and tuple(y.shape) == (3, N)
    assert torch.equal(y, op16(x.to(torch.bfloat16)).to(torch.float32))
    assert torch.equal(x, kept)  # the graph's float32 activations are not touched
    exact = op32(x)
    assert 1e-4 < float((y - exact).norm() / exact.norm()) < 2e-2  # bfloat16's rounding, nothing more
    one = linear(x[:1])  # one token: the decode operator, in float32
    assert one.dtype == torch.float32 and torch.equal(one, op32(x[:1]))


def test_bfloat16_is_admitted_where_the_kernel_takes_it(q4_0: RankWeight) -> None:
    chosen = dispatch_activations(q4_0, default_catalog(), "bfloat16")
    for op, trace in chosen.values():
        assert trace.selected == "cpu.int4pack@1" and trace.requested.activation_dtype == "bfloat16"
        assert op.op.activation_dtype == "bfloat16" and not trace.warnings


def test_a_kernel_ranked_first_that_takes_only_float32_runs_the_operator_in_float32(q4_0: RankWeight) -> None:
    catalog = Catalog([Float32OnlyInt4(), GgufDirectKernel(), ReferenceKernel()])
    chosen = dispatch_activations(q4_0, catalog, "bfloat16")  # gguf-direct would take bfloat16: not chosen
    for phase, (op, trace) in chosen.items():
        assert trace.selected == "cpu.int4pack-f32@1" and trace.requested.activation_dtype == "float32"
        assert op.op.activation_dtype == "float32"
        assert trace.warnings == (
            f"{q4_0.where} ({phase}): activations bfloat16 requested; runs float32: "
            "cpu.int4pack-f32@1 ranked first, refusing bfloat16 only",
        )


def test_a_kernel_ranked_first_taking_only_float32_on_its_slow_path_does_not_pull_the_operator_to_float32(
    q4_0: RankWeight,
) -> None:
    catalog = Catalog([SlowFloat32OnlyInt4(), GgufDirectKernel(), ReferenceKernel()])
    chosen = dispatch_activations(q4_0, catalog, "bfloat16")
    for op, trace in chosen.values():
        assert trace.selected == "cpu.gguf-direct@1" and op.op.activation_dtype == "bfloat16"
        assert not trace.warnings
        assert trace.candidates[0].kernel == "cpu.int4pack-f32@1"  # refused bfloat16: ranked first anyway
        assert trace.candidates[0].admission.reasons == (Reason.ACTIVATION_DTYPE,)


def test_no_kernel_taking_bfloat16_falls_back_to_float32_with_the_reasons(q4_0: RankWeight) -> None:
    catalog = Catalog([Float32OnlyInt4(), ReferenceKernel()])  # the reference: full dequant, forbidden
    chosen = dispatch_activations(q4_0, catalog, "bfloat16")
    for op, trace in chosen.values():
        assert trace.selected == "cpu.int4pack-f32@1" and op.op.activation_dtype == "float32"
        (note,) = trace.warnings
        assert "activations bfloat16 requested; runs float32: no kernel admits bfloat16 here" in note
        assert "activation_dtype" in note and "policy" in note  # every candidate's reason


def _report(rank: int, dtypes: list[str], e_kernel: float | None) -> dict[str, object]:
    dispatch = [
        {
            "weight": f"w{i}",
            "requested": {"activation_dtype": d},
            "warnings": [f"w{i} (decode): activations x"],
        }
        for i, d in enumerate(dtypes)
    ]
    ladders = [] if e_kernel is None else [{"l3": [{"e_kernel": e_kernel, "e_conversion": 0.0}]}]
    return {"rank": rank, "dispatch": dispatch, "ladders": ladders}


def test_the_l4_tolerance_follows_the_operators_dtype() -> None:
    f32 = tolerance([_report(0, ["float32"], 3e-7)], 2, 5.0)
    assert f32["activations"] == "float32" and f32["value"] == pytest.approx(64 * 1e-6 * 3 * 5)  # unchanged
    bf16 = tolerance([_report(0, ["bfloat16", "float32"], 2.5e-3)], 2, 5.0)  # a float32 head beside
    assert bf16["activations"] == "bfloat16" and bf16["value"] == pytest.approx(16 * 2**-8 * 3**0.5 * 5)
    assert bf16["value"] < 0.6  # an eighth of the logit scale: L4 still means something
    deep = tolerance([_report(0, ["bfloat16"], 2.5e-3)], 39, 5.0)["value"]
    assert deep < 0.5 * 5.0  # and at 39 layers, under half of it
    off = tolerance([_report(0, ["bfloat16"], None)], 2, 5.0)  # --ladder off: the dtype's floor still holds
    assert off["value"] == bf16["value"]
    converted = tolerance([_report(0, ["bfloat16"], 1e-2)], 2, 5.0)  # a recorded error above the floor
    assert converted["value"] == pytest.approx(16 * 1e-2 * 3**0.5 * 5)


def test_the_cache_tolerance_follows_the_runs_dtype() -> None:
    for dtype, expected in (("float32", 1e-3), ("bfloat16", 2**-8 * 3**0.5 * 5.0)):
        # a pp stage whose own operators all ran float32 in a bfloat16 run is still held to bfloat16
        assert cache_tolerance(dtype, 1e-3, 2, 5.0) == pytest.approx(expected)


def test_the_runtime_section_and_the_report_say_which_operators_ran_float32() -> None:
    runtime = runtime_section(
        "bfloat16", [_report(1, ["float32", "float32"], None), _report(0, ["bfloat16"], None)]
    )
    assert runtime == {
        "activations": "bfloat16",
        "ranks": {"0": "bfloat16", "1": "bfloat16"},
        "operators": {"bfloat16": 1, "float32": 2},
        "float32": ["rank 1 w0 (decode): activations x", "rank 1 w1 (decode): activations x"],
    }
    page = render_report({"runtime": runtime, "dispatch": [{"rank": 0, "activations": "bfloat16"}]})
    assert "bfloat16; 2 operators ran float32: rank 1 w0 (decode)" in page
    assert "<th>activations</th>" in page


def test_auto_resolves_by_the_ranks_device_and_the_report_says_so() -> None:
    assert activations_for("auto", "cpu") == "float32"
    assert activations_for("auto", "cuda") == "bfloat16"  # the CUDA int4 kernel takes nothing else
    assert activations_for("float32", "cuda") == "float32"  # asked explicitly: kept (and refused there)
    assert activations_for("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="expected one of auto, float32, bfloat16"):
        activations_for("fp8", "cpu")
    # an auto bring-up: each rank's operators are held to the dtype its own device resolved
    reports = [
        {**_report(0, ["float32", "float32"], None), "activations": "float32"},
        {**_report(1, ["bfloat16"], None), "activations": "bfloat16"},
    ]
    runtime = runtime_section("auto", reports)
    assert runtime["ranks"] == {"0": "float32", "1": "bfloat16"} and runtime["float32"] == []
    page = render_report({"runtime": runtime, "dispatch": []})
    assert "auto (bfloat16, float32)" in page


def test_activation_choices_agree_between_the_driver_and_the_ranks() -> None:
    # the driver checks --activations without importing torch (deploy.up.Activations); ranks use rank_ops
    from typing import get_args

    from shardport.deploy.rank_ops import ACTIVATION_CHOICES
    from shardport.deploy.up import Activations

    assert get_args(Activations) == ACTIVATION_CHOICES
