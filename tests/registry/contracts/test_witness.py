"""Decode witnesses: recorded, re-checked, and catching what the gates cannot (a swapped nibble order)."""

from __future__ import annotations

import numpy as np
import pytest

from shardport.registry.contracts import (
    DecodeWitness,
    LogicalWeight,
    check_witness,
    compare_witness,
    decode_weight,
    infer_safetensors,
    make_witness,
    reference_error_gate,
    run_gates,
)
from shardport.registry.contracts.errors import ReferenceErrorTooLargeError, WitnessMismatchError
from shardport.registry.contracts.witness import choose_rows, witness_values

PREFIX = "model.layers.4.mlp.up_proj"
AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}}
GPTQ = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}}


def _awq(build):
    case = build.make_quantized(n=32, k=64, group_size=32, seed=5)
    planes = build.awq_planes(case, PREFIX)
    (weight,) = infer_safetensors(AWQ, build.inventory(planes))
    return weight, planes


def test_rows_are_a_pure_function_of_seed():
    assert choose_rows(100, 7) == choose_rows(100, 7)
    assert choose_rows(100, 7) != choose_rows(100, 8)
    assert choose_rows(3, 1, count=8) == (0, 1, 2)


def test_witness_round_trip_and_check(build):
    weight, planes = _awq(build)
    witness = make_witness(weight, planes, seed=11)
    assert len(witness.rows) == 4 and witness.columns == 64 and witness.rel_error is None
    assert np.array_equal(witness_values(witness), decode_weight(weight, planes, witness.rows))
    restored = DecodeWitness.model_validate_json(witness.model_dump_json())
    assert restored == witness
    signed = weight.model_copy(update={"witness": witness})
    check_witness(signed, planes)
    assert len(witness.values_f32le) < 4096  # a few KiB at most


def test_swapped_nibble_order_passes_gates_but_fails_the_witness(build):
    weight, planes = _awq(build)
    witness = make_witness(weight, planes, seed=3)
    data = weight.model_dump(mode="json")
    for part in ("codes", "zero_point"):
        data["contract"][part]["packing"]["slot_order"] = list(range(8))  # natural order, as GPTQ
    swapped = LogicalWeight.model_validate(data)
    run_gates(swapped, planes)  # every order is valid bytes
    with pytest.raises(WitnessMismatchError, match="slot order"):
        check_witness(swapped, planes, witness)


def test_consumer_decode_within_tolerance(build):
    weight, planes = _awq(build)
    witness = make_witness(weight, planes, seed=1)
    as_fp16 = witness_values(witness).astype(np.float16).astype(np.float32)
    with pytest.raises(WitnessMismatchError):
        compare_witness(witness, as_fp16 + 1e-2, tensor=weight.name)
    compare_witness(witness, as_fp16, tensor=weight.name, rtol=1e-3, atol=1e-6)
    with pytest.raises(WitnessMismatchError, match="shape"):
        compare_witness(witness, as_fp16[:2])


def test_missing_or_foreign_witness_is_refused(build):
    weight, planes = _awq(build)
    with pytest.raises(WitnessMismatchError, match="none"):
        check_witness(weight, planes)
    foreign = make_witness(weight, planes, seed=1).model_copy(update={"rows": (0, 1, 2, 99)})
    with pytest.raises(WitnessMismatchError, match="another weight"):
        check_witness(weight, planes, foreign)


def _quantize_gptq(build, reference: np.ndarray, group: int = 32):
    """Honest 4-bit min-max quantization of reference [N, K] into GPTQ planes (zero-1 stored)."""
    n, k = reference.shape
    grouped = reference.T.reshape(k // group, group, n)
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    scales = ((high - low) / 15).astype(np.float16)
    zeros = np.clip(np.round(-low / scales.astype(np.float32)), 1, 15).astype(np.int64)
    q = np.clip(np.round(reference.T / np.repeat(scales, group, 0)) + np.repeat(zeros, group, 0), 0, 15)
    case = {
        "q": q.astype(np.int64),
        "zeros": zeros,
        "scales": scales,
        "g_idx": (np.arange(k) // group).astype(np.int32),
        "bits": 4,
    }
    return build.gptq_planes(case, PREFIX)


def test_reference_error_gate_catches_a_convention_mislabel(build):
    rng = np.random.default_rng(0)
    reference = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    planes = _quantize_gptq(build, reference)
    (honest,) = infer_safetensors(GPTQ, build.inventory(planes))
    witness = make_witness(honest, planes, seed=2, count=8, reference=reference)
    assert witness.rel_error is not None and witness.rel_error < 0.15

    mislabelled = {"weights": {"*": {"zero_point": {"convention": "as_is"}}}}
    (wrong,) = infer_safetensors(GPTQ, build.inventory(planes), declare=mislabelled)
    with pytest.raises(ReferenceErrorTooLargeError, match="zero-point convention"):
        make_witness(wrong, planes, seed=2, count=8, reference=reference)
    rows = list(witness.rows)
    error = reference_error_gate(decode_weight(honest, planes, rows), reference[rows], 4)
    assert error == pytest.approx(witness.rel_error)
    with pytest.raises(ReferenceErrorTooLargeError):
        reference_error_gate(decode_weight(wrong, planes, rows), reference[rows], 4)
