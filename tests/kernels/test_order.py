"""The candidates' order: preferred first, then fast paths, then slow paths, then the fallback classes."""

from __future__ import annotations

import kernel_cases as kc
import pytest

from shardport.deploy.up_evidence import expected_kernel, kernel_path
from shardport.kernels import (
    Catalog,
    FallbackPolicy,
    default_catalog,
    dispatch,
    operator_signature,
    ordered,
    rank_weight,
    this_cpu,
)
from shardport.kernels.catalog import slow_path
from shardport.kernels.gguf_kernel import GgufDirectKernel
from shardport.kernels.int4_cpu import CAPABILITY as INT4
from shardport.kernels.int4_cpu import Int4CpuKernel
from shardport.kernels.int8_kernel import CAPABILITY as INT8
from shardport.kernels.reference import FullDequantKernel, ReferenceKernel

CPU = ("cpu.int4pack", "cpu.int8pack")  # the packed torch kernels: vectorised for bfloat16 only


class SlowEverywhere(Int4CpuKernel):
    """int4pack declared slow in every dtype (the order must still keep it before the fallbacks)."""

    capability = INT4.model_copy(
        update={"id": "cpu.slow", "slow_activations": ("float32", "bfloat16", "float16")}
    )


@pytest.mark.parametrize(
    ("dtype", "preferred", "expected"),
    [
        (
            "bfloat16",
            (),
            (
                "cpu.int4pack",
                "cpu.int4-direct",
                "cpu.int8pack",
                "cpu.gguf-direct",
                "cuda.int4-tinygemm",
                "full-dequant",
                "reference",
            ),
        ),
        (
            "float32",
            (),
            (
                "cpu.int4-direct",
                "cpu.gguf-direct",
                "cuda.int4-tinygemm",
                "cpu.int4pack",
                "cpu.int8pack",
                "full-dequant",
                "reference",
            ),
        ),
        (
            "float16",
            (),
            (
                "cpu.int4-direct",
                "cpu.gguf-direct",
                "cuda.int4-tinygemm",
                "cpu.int4pack",
                "cpu.int8pack",
                "full-dequant",
                "reference",
            ),
        ),
        (  # preferred overrides the slow path, in the manifest's order; the rest keeps its tiers
            "float32",
            ("cpu.int8pack@1", "reference", "cpu.int4pack"),
            (
                "cpu.int8pack",
                "reference",
                "cpu.int4pack",
                "cpu.int4-direct",
                "cpu.gguf-direct",
                "cuda.int4-tinygemm",
                "full-dequant",
            ),
        ),
        (  # a kernel named twice (id and id@version) is tried once; an unknown id names nothing
            "float32",
            ("cpu.int4pack", "cpu.int4pack@1", "cpu.nothing"),
            (
                "cpu.int4pack",
                "cpu.int4-direct",
                "cpu.gguf-direct",
                "cuda.int4-tinygemm",
                "cpu.int8pack",
                "full-dequant",
                "reference",
            ),
        ),
    ],
)
def test_order_of_the_default_catalog(dtype, preferred, expected):
    assert tuple(k.capability.id for k in ordered(default_catalog(), dtype, preferred)) == expected


def test_a_kernel_slow_in_every_dtype_stays_before_the_fallbacks_and_ordered_keeps_its_input():
    catalog = Catalog([FullDequantKernel(), SlowEverywhere(), ReferenceKernel(), GgufDirectKernel()])
    ids = [k.capability.id for k in ordered(catalog, "bfloat16")]
    assert ids == ["cpu.gguf-direct", "cpu.slow", "full-dequant", "reference"]
    assert catalog.ids == ("full-dequant", "cpu.slow", "reference", "cpu.gguf-direct")  # pure


@pytest.mark.parametrize("kernel", CPU)
@pytest.mark.parametrize(("dtype", "slow"), [("float32", True), ("float16", True), ("bfloat16", False)])
def test_the_packed_cpu_kernels_declare_their_slow_dtypes(kernel, dtype, slow):
    cap = {INT4.id: INT4, INT8.id: INT8}[kernel]
    assert dtype in cap.activation_dtypes  # still admitted: only the order changes
    assert slow_path(cap, dtype) is slow


@pytest.fixture(scope="module")
def q4_0():
    case = kc.gguf("Q4_0", 64, 256)
    return rank_weight(case.weight, case.planes)


def test_float32_q4_0_selects_the_direct_kernel_and_notes_why_int4pack_came_later(q4_0):
    prepared, trace = dispatch(q4_0, default_catalog(), activation_dtype="float32", phase="prefill")
    assert trace.selected == "cpu.gguf-direct@1" and trace.transformation == "none"
    assert prepared.transformation == "none" and not trace.warnings
    assert kernel_path(trace.model_dump(mode="json")) == "fast"
    (int4,) = [c for c in trace.candidates if c.kernel == "cpu.int4pack@1"]
    assert int4.admission.accepted and not int4.prepared  # admitted for the trace, never repacked
    assert int4.note == "slow path for float32 (unvectorised); tried after the kernels on their fast path"
    assert [c.kernel for c in trace.candidates].index("cpu.int4pack@1") > 0


def test_bfloat16_q4_0_still_selects_int4pack(q4_0):
    _, trace = dispatch(q4_0, default_catalog(), activation_dtype="bfloat16", phase="prefill")
    assert trace.selected == "cpu.int4pack@1" and trace.candidates[0].kernel == "cpu.int4pack@1"
    assert all(c.note is None for c in trace.candidates) and not trace.warnings


def test_a_slow_path_kernel_selected_when_nothing_faster_is_admitted_is_noted(q4_0):
    catalog = Catalog([Int4CpuKernel(), FullDequantKernel(), ReferenceKernel()])
    _, trace = dispatch(q4_0, catalog, activation_dtype="float32", phase="decode")
    assert trace.selected == "cpu.int4pack@1" and trace.transformation == "repack"
    assert trace.warnings == (
        f"{q4_0.where} (decode): cpu.int4pack@1 runs its slow path for float32: no fast path was selectable",
    )
    assert kernel_path(trace.model_dump(mode="json")) == "slow"  # the evidence's dispatch row says so


def test_a_preferred_slow_kernel_goes_first_and_the_trace_says_the_manifest_chose_it(q4_0):
    _, trace = dispatch(
        q4_0, default_catalog(), activation_dtype="float32", phase="decode", preferred=["cpu.int4pack"]
    )
    assert trace.selected == "cpu.int4pack@1" and trace.candidates[0].kernel == "cpu.int4pack@1"
    assert (
        trace.candidates[0].note
        == "slow path for float32 (unvectorised); tried first: the manifest prefers it"
    )
    (warning,) = trace.warnings
    assert warning.endswith("cpu.int4pack@1 runs its slow path for float32: the manifest prefers it")


@pytest.mark.parametrize(
    ("dtype", "preferred", "policy", "expected"),
    [
        ("float32", (), FallbackPolicy(), "cpu.gguf-direct@1"),
        ("bfloat16", (), FallbackPolicy(), "cpu.int4pack@1"),
        ("float16", (), FallbackPolicy(), "cpu.gguf-direct@1"),
        ("float32", ("cpu.int4pack",), FallbackPolicy(), "cpu.int4pack@1"),
        ("float32", ("full-dequant",), FallbackPolicy.from_cli("allow"), "full-dequant@1"),
        ("float32", ("full-dequant",), FallbackPolicy(), "cpu.gguf-direct@1"),  # forbidden: skipped
    ],
)
def test_l5_expects_what_dispatch_selects(q4_0, dtype, preferred, policy, expected):
    """The evidence's expected kernel is computed by the same order as dispatch: they cannot disagree."""
    op = operator_signature(q4_0, dtype, "prefill", this_cpu())
    _, trace = dispatch(
        q4_0, default_catalog(), activation_dtype=dtype, phase="prefill", preferred=preferred, policy=policy
    )
    assert trace.selected == expected_kernel(op, policy, preferred) == expected


@pytest.fixture(scope="module")
def gptq():
    case = kc.gptq(64, 256, 32)
    return rank_weight(case.weight, case.planes)


@pytest.mark.parametrize(
    ("name", "dtype", "required", "expected"),
    [  # the manifest's kernels_required narrows dispatch; L5's expectation must narrow the same way
        ("gptq", "float32", ("cpu.int4pack",), "cpu.int4pack@1"),
        ("q4_0", "float32", ("cpu.int4pack",), "cpu.int4pack@1"),
        ("gptq", "bfloat16", ("cpu.int4-direct",), "cpu.int4-direct@1"),
        ("q4_0", "bfloat16", ("cpu.gguf-direct@1",), "cpu.gguf-direct@1"),
        ("q4_0", "float32", ("cpu.int8pack",), None),  # required but not admitted: nothing to expect
    ],
)
def test_l5_expects_only_required_kernels(request, name, dtype, required, expected):
    weight = request.getfixturevalue(name)
    op = operator_signature(weight, dtype, "decode", this_cpu())
    policy = FallbackPolicy()
    assert expected_kernel(op, policy, ()) != expected  # without the requirement another kernel comes first
    assert expected_kernel(op, policy, (), required) == expected
    if expected is not None:
        catalog = default_catalog()
        _, trace = dispatch(weight, catalog, activation_dtype=dtype, phase="decode", required=required)
        assert trace.selected == expected
