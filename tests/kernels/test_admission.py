"""Admission, table-driven: every kernel x representation, accepted exactly where it should be."""

from __future__ import annotations

import kernel_cases as kc
import pytest

from shardport.kernels import Device, admit, default_catalog, operator_signature, rank_weight
from shardport.kernels.admission import Reason
from shardport.kernels.int4_cpu import CAPABILITY as INT4
from shardport.kernels.reference import FULL_DEQUANT, REFERENCE
from shardport.registry.contracts import TensorInfo, infer_gguf

CPU = Device(kind="cpu", isa="AVX512")
N, K = 64, 256


def _op(case, bounds=None, *, dtype="float32", phase="decode", device=CPU):
    planes = kc.slice_planes(case, bounds) if bounds else case.planes
    return operator_signature(rank_weight(case.weight, planes, bounds), dtype, phase, device)


def _gguf_other(ggml_type: str):
    tensor = "blk.0.ffn_down.weight"
    (weight,) = infer_gguf({"general.architecture": "llama"}, [TensorInfo(tensor, ggml_type, (N, K))])
    return weight


CASES = {
    "gptq": lambda: kc.gptq(N, K, 32),
    "gptq_v2": lambda: kc.gptq(N, K, 32, v2=True),
    "gptq_g128": lambda: kc.gptq(N, K, 128),
    "gptq_g16": lambda: kc.gptq(N, K, 16),
    "gptq_tail": lambda: kc.gptq(N, 336, 32),
    "awq": lambda: kc.awq(N, K, 32),
    "ct_sym": lambda: kc.compressed_tensors(N, K, 32),
    "ct_asym": lambda: kc.compressed_tensors(N, K, 32, symmetric=False),
    "q4_0": lambda: kc.gguf("Q4_0", N, K),
    "q4_1": lambda: kc.gguf("Q4_1", N, K),
}

# representation -> reasons cpu.int4pack refuses it for (empty: accepted)
INT4_EXPECTED = {
    "gptq": (),
    "gptq_v2": (),
    "gptq_g128": (),
    "gptq_g16": (Reason.GROUP_SIZE,),
    "gptq_tail": (Reason.TAIL_GROUP, Reason.K_MULTIPLE),
    "awq": (),
    "ct_sym": (),
    "ct_asym": (),
    "q4_0": (),
    "q4_1": (),
}


@pytest.fixture(scope="module")
def cases():
    return {name: build() for name, build in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_int4_table(cases, name):
    verdict = admit(_op(cases[name]), INT4)
    assert verdict.reasons == INT4_EXPECTED[name], str(verdict)
    assert verdict.accepted == (not INT4_EXPECTED[name])
    for refusal in verdict.refusals:  # every refusal says what was expected and what was found
        assert refusal.expected and refusal.found


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("cap", [REFERENCE, FULL_DEQUANT], ids=["reference", "full-dequant"])
def test_reference_and_full_dequant_take_every_representation(cases, name, cap):
    assert admit(_op(cases[name]), cap).accepted
    assert admit(_op(cases[name], dtype="bfloat16", phase="prefill"), cap).accepted


@pytest.mark.parametrize(
    ("ggml_type", "reason"),
    [("Q8_0", Reason.LAYOUT), ("Q4_K", Reason.LAYOUT), ("Q6_K", Reason.LAYOUT), ("BF16", Reason.LAYOUT)],
)
def test_int4_refuses_other_gguf_types_by_layout(ggml_type, reason):
    weight = _gguf_other(ggml_type)
    op = operator_signature(
        rank_weight(weight, {weight.contract.plane: _zeros(weight)}), "float32", "decode", CPU
    )
    verdict = admit(op, INT4)
    assert verdict.reasons == (reason,) and "gguf:" + ggml_type in str(verdict)


def _zeros(weight):
    import numpy as np

    from shardport.registry.contracts.gguf_blocks import row_bytes

    return np.zeros((N, row_bytes(weight.contract.ggml_type, K, "t")), dtype=np.uint8)


def test_wrong_device_and_isa(cases):
    cuda = _op(cases["gptq"], device=Device(kind="cuda", cc=(9, 0)))
    assert admit(cuda, INT4).reasons == (Reason.DEVICE,)
    assert "cuda/sm90" in str(admit(cuda, INT4))
    arm = _op(cases["gptq"], device=Device(kind="cpu", isa="SVE256"))
    assert admit(arm, INT4).reasons == (Reason.ISA,)


def test_misaligned_local_n_from_a_tp3_column_split(cases):
    case = kc.gptq(120, K, 32)  # tp 3 on N=120: 40 rows each, not a multiple of int4pack's 16
    for bounds in kc.rank_bounds(case, 3, "column", 8):
        verdict = admit(_op(case, bounds), INT4)
        assert verdict.reasons == (Reason.N_MULTIPLE,) and "40" in str(verdict)


def test_tail_group_only_on_the_rank_that_holds_it():
    case = kc.gptq(N, 336, 32)  # 10.5 groups: the last K slice ends in a partial group
    verdicts = [admit(_op(case, b), INT4) for b in kc.rank_bounds(case, 2, "row", 32)]
    assert verdicts[0].accepted
    assert Reason.TAIL_GROUP in verdicts[1].reasons


def test_wrong_zero_point_convention_and_act_order(cases):
    op = _op(cases["awq"])
    assert admit(op.model_copy(update={"zero_point": "float_plane"}), INT4).reasons == (Reason.ZERO_POINT,)
    assert admit(op.model_copy(update={"act_order": True}), INT4).reasons == (Reason.ACT_ORDER,)
    assert admit(op.model_copy(update={"permutation": True}), INT4).reasons == (Reason.PERMUTATION,)


def test_signed_scale_contract_refused_by_a_positive_only_capability(cases):
    """None of the CPU kernels refuses signed scales (each multiplies the scale in float); the predicate
    refuses GGUF's signed block scales for a kernel that declares positive scales only."""
    positive_only = INT4.model_copy(update={"id": "positive-scales", "scale_signs": ("positive",)})
    q4_0 = _op(cases["q4_0"])
    assert q4_0.scale_sign == "signed"
    assert admit(q4_0, INT4).accepted
    assert admit(q4_0, positive_only).reasons == (Reason.SCALE_SIGN,)
    assert admit(_op(cases["gptq"]), positive_only).accepted


def test_phase_and_activation_dtype(cases):
    decode_only = INT4.model_copy(update={"phases": ("decode",), "activation_dtypes": ("bfloat16",)})
    verdict = admit(_op(cases["gptq"], phase="prefill"), decode_only)
    assert verdict.reasons == (Reason.PHASE, Reason.ACTIVATION_DTYPE)


def test_default_catalog_order():
    assert default_catalog().ids[0] == "cpu.int4pack" and default_catalog().ids[-1] == "reference"
