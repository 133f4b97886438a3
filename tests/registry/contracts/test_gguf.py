"""GGUF block types: our decoders equal gguf-py's dequantize bit for bit in float32."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from shardport.registry.contracts import TensorInfo, decode_weight, infer_gguf, run_gates
from shardport.registry.contracts.errors import PlaneSizeError, ScaleValueError
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES

QUANTIZABLE = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
K_QUANTS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the fp16 super-scales
N, K = 6, 512


def _random_k_blocks(name: str, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for every field, with finite fp16 d/dmin written over the scale fields."""
    block_size, type_size = BLOCK_SIZES[name]
    raw = rng.integers(0, 256, size=(N, K // block_size, type_size), dtype=np.uint8)
    for offset in K_QUANTS[name]:
        halves = (rng.standard_normal((N, K // block_size, 1)) * 0.05).astype("<f2")
        raw[:, :, offset : offset + 2] = halves.view(np.uint8)
    return raw.reshape(N, -1)


def _data(name: str) -> np.ndarray:
    rng = np.random.default_rng(sum(map(ord, name)))
    if name in K_QUANTS:
        return _random_k_blocks(name, rng)
    return quants.quantize(rng.standard_normal((N, K)).astype(np.float32), GGMLQuantizationType[name])


def _weight(name: str, data: np.ndarray, tensor: str = "blk.0.ffn_down.weight"):
    inventory = [TensorInfo(tensor, name, (N, K)), TensorInfo("output.weight", "F32", (2, 32))]
    weights = infer_gguf({"general.architecture": "llama"}, inventory)
    return next(w for w in weights if w.name == tensor)


@pytest.mark.parametrize("name", [*QUANTIZABLE, *K_QUANTS])
def test_decode_parity_with_gguf_py(name):
    data = _data(name)
    reference = quants.dequantize(data, GGMLQuantizationType[name]).astype(np.float32)
    weight = _weight(name, data)
    planes = {weight.contract.plane: data}
    decoded = decode_weight(weight, planes)
    assert decoded.shape == (N, K)
    assert np.array_equal(decoded.view(np.uint32), reference.view(np.uint32))
    assert np.array_equal(decode_weight(weight, planes, rows=[4, 1]), reference[[4, 1]])
    run_gates(weight, planes)


def test_raw_bytes_are_accepted_and_truncation_refused():
    data = _data("Q4_K")
    weight = _weight("Q4_K", data)
    raw = np.frombuffer(data.tobytes(), dtype=np.uint8)
    assert np.array_equal(
        decode_weight(weight, {weight.contract.plane: raw}),
        quants.dequantize(data, GGMLQuantizationType.Q4_K),
    )
    with pytest.raises(PlaneSizeError, match="truncated"):
        decode_weight(weight, {weight.contract.plane: raw[:-144]})


def test_non_finite_block_scale_is_refused():
    data = _data("Q8_0").copy()
    data[0, 0:2] = np.array([np.inf], dtype="<f2").view(np.uint8)
    weight = _weight("Q8_0", data)
    with pytest.raises(ScaleValueError):
        run_gates(weight, {weight.contract.plane: data})


def test_gguf_inference_binds_graph_and_grades():
    inventory = [
        TensorInfo("token_embd.weight", "Q4_K", (32, 256)),
        TensorInfo("blk.2.attn_q.weight", "Q8_0", (32, 256)),
        TensorInfo("blk.2.attn_norm.weight", "F32", (256,)),
        TensorInfo("blk.2.ffn_down.weight", "Q6_K", (256, 256)),
    ]
    weights = {w.name: w for w in infer_gguf({"general.architecture": "llama"}, inventory)}
    embed = weights["token_embd.weight"]
    assert embed.binding.slot == "embed_tokens" and embed.binding.tied_alias == "lm_head"
    q = weights["blk.2.attn_q.weight"]
    assert (q.binding.layer, q.binding.slot, q.binding.architecture) == (2, "self_attn.q_proj", "llama")
    assert q.contract.grit.expressible and q.contract.grit.grade.startswith("grit1(e=s8,k0=32")
    assert embed.contract.grit.expressible  # Q4_K is GRIT's reference grade Q4KS
    assert not weights["blk.2.ffn_down.weight"].contract.grit.expressible
    norm = weights["blk.2.attn_norm.weight"]
    assert norm.shape.axes == ("N",) and norm.contract.label.evidence == ("gguf tensor type F32",)
