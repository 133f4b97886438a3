"""GPTQ and AWQ: reference decode against an independent unpacking, and the zero-point convention."""

from __future__ import annotations

import numpy as np
import pytest

from shardport.registry.contracts import AffineIntContract, decode_weight, infer_safetensors, run_gates
from shardport.registry.contracts.errors import ContractAmbiguousError, DeclareSpecError

GPTQ_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "quantization_config": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "desc_act": False,
        "sym": False,
    },
}
AWQ_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "quantization_config": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 32,
        "zero_point": True,
        "version": "gemm",
    },
}
PREFIX = "model.layers.0.mlp.down_proj"


def _only(weights, name=f"{PREFIX}.weight"):
    return next(w for w in weights if w.name == name)


def test_gptq_decode_matches_independent_unpacking(build):
    case = build.make_quantized(n=16, k=80, group_size=32)  # 3 groups, the last one partial
    planes = build.gptq_planes(case, PREFIX)
    weight = _only(infer_safetensors(GPTQ_CONFIG, build.inventory(planes)))
    assert weight.shape.extents == (16, 80)
    assert weight.contract.scales.group_count == 3 and weight.contract.scales.tail_rule == "partial_last"
    expected = build.expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    decoded = decode_weight(weight, planes)
    assert decoded.dtype == np.float32 and np.array_equal(decoded, expected)
    assert np.array_equal(decode_weight(weight, planes, rows=[5, 2]), expected[[5, 2]])
    run_gates(weight, planes, build.inventory(planes))


def test_gptq_act_order_uses_g_idx(build):
    case = build.make_quantized(n=8, k=64, group_size=16, act_order=True, seed=3)
    planes = build.gptq_planes(case, PREFIX)
    config = {
        "quantization_config": {**GPTQ_CONFIG["quantization_config"], "group_size": 16, "desc_act": True}
    }
    weight = _only(infer_safetensors(config, build.inventory(planes)))
    assert weight.contract.group_map.kind == "g_idx" and not weight.contract.group_map.sequential
    expected = build.expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    assert np.array_equal(decode_weight(weight, planes), expected)
    run_gates(weight, planes)


@pytest.mark.parametrize("bits", [2, 8])
def test_gptq_other_widths(build, bits):
    case = build.make_quantized(n=16, k=64, group_size=32, bits=bits, seed=bits)
    planes = build.gptq_planes(case, PREFIX)
    config = {"quantization_config": {**GPTQ_CONFIG["quantization_config"], "bits": bits}}
    weight = _only(infer_safetensors(config, build.inventory(planes)))
    expected = build.expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    assert np.array_equal(decode_weight(weight, planes), expected)


def test_awq_decode_matches_independent_unpacking(build):
    case = build.make_quantized(n=32, k=64, group_size=32, seed=1)
    planes = build.awq_planes(case, PREFIX)
    weight = _only(infer_safetensors(AWQ_CONFIG, build.inventory(planes)))
    assert weight.contract.codes.packing.slot_order == tuple(build.AWQ_ORDER)
    expected = build.expected_decode(case["q"], case["zeros"], case["scales"], np.arange(64) // 32)
    assert np.array_equal(decode_weight(weight, planes), expected)
    assert np.array_equal(decode_weight(weight, planes, rows=[31, 0, 9]), expected[[31, 0, 9]])
    run_gates(weight, planes)


def test_identical_qzeros_decode_per_declared_convention(build):
    """The same qzeros bytes mean zero-1 under GPTQ and the zero under AWQ (gptq_v2): both are right."""
    case = build.make_quantized(n=16, k=64, group_size=32, seed=7)
    planes = build.gptq_planes(case, PREFIX)  # qzeros store zero-1
    as_v1 = _only(infer_safetensors(GPTQ_CONFIG, build.inventory(planes)))
    v2_config = {
        "quantization_config": {**GPTQ_CONFIG["quantization_config"], "checkpoint_format": "gptq_v2"}
    }
    as_v2 = _only(infer_safetensors(v2_config, build.inventory(planes)))
    assert as_v1.contract.zero_point.convention == "minus_one"
    assert as_v2.contract.zero_point.convention == "as_is"
    truth = build.expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    shifted = build.expected_decode(case["q"], case["zeros"] - 1, case["scales"], case["g_idx"])
    assert np.array_equal(decode_weight(as_v1, planes), truth)
    assert np.array_equal(decode_weight(as_v2, planes), shifted)
    assert not np.array_equal(truth, shifted)

    # An AWQ checkpoint storing the same qzeros integers (as is) decodes by its own convention.
    awq_case = {**case, "zeros": case["zeros"] - 1}
    awq_planes = build.awq_planes(awq_case, PREFIX)
    awq = _only(infer_safetensors(AWQ_CONFIG, build.inventory(awq_planes)))
    gptq_zero_ints = as_v1.contract.zero_point
    assert isinstance(awq.contract, AffineIntContract) and gptq_zero_ints.kind == "int_plane"
    assert np.array_equal(decode_weight(awq, awq_planes), shifted)


def test_unknown_convention_is_refused_with_what_to_declare(build):
    case = build.make_quantized(n=8, k=64, group_size=32)
    planes = build.gptq_planes(case, PREFIX)
    with pytest.raises(ContractAmbiguousError) as caught:
        infer_safetensors({"architectures": ["LlamaForCausalLM"]}, build.inventory(planes))
    message = str(caught.value)
    assert (
        "quant_method" in message
        and "gptq" in message
        and "awq" in message
        and "[0,2,4,6,1,3,5,7]" in message
    )
    declared = infer_safetensors(
        {},
        build.inventory(planes),
        declare='{"quantization": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": false}}',
    )
    weight = _only(declared)
    assert weight.contract.label.kind == "declared"
    assert any(
        line.startswith("--declare quantization.quant_method") for line in weight.contract.label.evidence
    )
    expected = build.expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    assert np.array_equal(decode_weight(weight, planes), expected)


def test_weight_declaration_overrides_a_field(build):
    case = build.make_quantized(n=8, k=64, group_size=32)
    planes = build.gptq_planes(case, PREFIX)
    spec = {"weights": {"*.down_proj.weight": {"zero_point": {"convention": "as_is"}}}}
    weight = _only(infer_safetensors(GPTQ_CONFIG, build.inventory(planes), declare=spec))
    assert weight.contract.zero_point.convention == "as_is"
    assert weight.contract.label.kind == "declared"
    assert weight.contract.grit.grade is not None and "zpc" not in weight.contract.grit.grade
    with pytest.raises(DeclareSpecError):
        infer_safetensors(
            GPTQ_CONFIG, build.inventory(planes), declare={"weights": {"*": {"decode_law": "magic"}}}
        )
    with pytest.raises(DeclareSpecError):
        infer_safetensors(GPTQ_CONFIG, build.inventory(planes), declare="{not json")


def test_autogptq_quantize_config_and_grit(build):
    case = build.make_quantized(n=8, k=64, group_size=32)
    planes = build.gptq_planes(case, PREFIX, g_idx=False)
    quantize_config = {"bits": 4, "group_size": 32, "desc_act": False, "sym": True}
    weight = _only(infer_safetensors({}, build.inventory(planes), quantize_config=quantize_config))
    assert weight.contract.label.kind == "inferred"
    assert "AutoGPTQ" in " ".join(weight.contract.label.evidence)
    assert weight.contract.grit.expressible
    assert weight.contract.grit.grade == "grit1(e=u4,k0=32,s0=binary16,zp=u4,zpc=minus1,esr=affineminmax)"
