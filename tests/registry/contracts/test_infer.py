"""Contract inference: planes bound to their weight, graph bindings, labels, evidence and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from shardport.registry.contracts import TensorInfo, decode_weight, infer_safetensors
from shardport.registry.contracts.errors import UnsupportedContractError


def _inv(*entries: tuple[str, str, tuple[int, ...]]) -> list[TensorInfo]:
    return [TensorInfo(name, dtype, shape) for name, dtype, shape in entries]


def test_float_checkpoint_bindings_and_tied_embeddings():
    inventory = _inv(
        ("model.embed_tokens.weight", "BF16", (32, 16)),
        ("model.layers.3.self_attn.q_proj.weight", "BF16", (16, 16)),
        ("model.layers.3.self_attn.q_proj.bias", "F32", (16,)),
        ("model.layers.3.mlp.experts.5.down_proj.weight", "F16", (16, 8)),
        ("model.norm.weight", "F32", (16,)),
    )
    config = {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True}
    weights = {w.name: w for w in infer_safetensors(config, inventory)}
    embed = weights["model.embed_tokens.weight"]
    assert (embed.binding.slot, embed.binding.tied_alias, embed.binding.layer) == (
        "embed_tokens",
        "lm_head",
        None,
    )
    q = weights["model.layers.3.self_attn.q_proj.weight"]
    assert (q.binding.layer, q.binding.slot, q.binding.architecture) == (
        3,
        "self_attn.q_proj",
        "LlamaForCausalLM",
    )
    assert weights["model.layers.3.self_attn.q_proj.bias"].binding.slot == "self_attn.q_proj.bias"
    expert = weights["model.layers.3.mlp.experts.5.down_proj.weight"]
    assert (expert.binding.slot, expert.binding.expert) == ("mlp.experts.down_proj", 5)
    assert q.contract.family == "float" and q.contract.format == "bfloat16"
    assert q.contract.label.kind == "inferred" and not q.contract.grit.expressible
    assert [plane.role for plane in q.planes] == ["float"]
    bits = np.arange(256, dtype=np.uint16).reshape(16, 16) | np.uint16(0x3F00)
    decoded = decode_weight(q, {q.name: bits})
    assert np.array_equal(decoded.view(np.uint32), bits.astype(np.uint32) << 16)


def test_untied_head_is_not_aliased():
    inventory = _inv(("model.embed_tokens.weight", "F16", (8, 4)), ("lm_head.weight", "F16", (8, 4)))
    weights = {w.name: w for w in infer_safetensors({"tie_word_embeddings": False}, inventory)}
    assert weights["model.embed_tokens.weight"].binding.tied_alias is None
    assert weights["lm_head.weight"].binding.slot == "lm_head"


def test_quantized_checkpoint_binds_companions_and_keeps_floats(build):
    case = build.make_quantized(n=16, k=64, group_size=32)
    planes = build.gptq_planes(case, "model.layers.0.mlp.gate_proj")
    planes["model.layers.0.mlp.gate_proj.bias"] = np.zeros(16, dtype=np.float16)
    planes["lm_head.weight"] = np.zeros((8, 64), dtype=np.float16)
    config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}}
    weights = {w.name: w for w in infer_safetensors(config, build.inventory(planes))}
    assert set(weights) == {
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.gate_proj.bias",
        "lm_head.weight",
    }
    gate = weights["model.layers.0.mlp.gate_proj.weight"]
    roles = {plane.role: plane.tensor.rpartition(".")[2] for plane in gate.planes}
    assert roles == {"codes": "qweight", "zero": "qzeros", "scale": "scales", "g_idx": "g_idx"}
    assert gate.contract.label.evidence[0] == "config.json quantization_config.quant_method=gptq"
    assert gate.binding.slot == "mlp.gate_proj" and gate.binding.layer == 0
    assert gate.contract.group_map.sequential


def test_autoawq_quant_config_is_recognised(build):
    case = build.make_quantized(n=16, k=64, group_size=32)
    planes = build.awq_planes(case, "model.layers.1.mlp.up_proj")
    quant_config = {"w_bit": 4, "q_group_size": 32, "zero_point": True, "version": "GEMM"}
    (weight,) = infer_safetensors({}, build.inventory(planes), quantize_config=quant_config)
    assert "AutoAWQ" in weight.contract.label.evidence[0]
    assert weight.contract.zero_point.convention == "as_is"
    assert weight.contract.grit.grade == "grit1(e=u4,k0=32,s0=binary16,zp=u4,esr=affineminmax)"


def test_refusals_name_the_tensor():
    with pytest.raises(UnsupportedContractError, match=r"model\.rotary\.inv_freq"):
        infer_safetensors({}, _inv(("model.rotary.inv_freq", "I64", (8,))))
    with pytest.raises(UnsupportedContractError, match="version"):
        infer_safetensors(
            {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}},
            _inv(("m.qweight", "I32", (64, 2)), ("m.qzeros", "I32", (2, 2)), ("m.scales", "F16", (2, 16))),
        )
    with pytest.raises(UnsupportedContractError, match="bits"):
        infer_safetensors(
            {"quantization_config": {"quant_method": "gptq", "bits": 3, "group_size": 32}},
            _inv(("m.qweight", "I32", (6, 16)), ("m.qzeros", "I32", (2, 2)), ("m.scales", "F16", (2, 16))),
        )
