"""compressed-tensors pack-quantized: compress with the package, decode with ours, equal its decompressor."""

from __future__ import annotations

import compressed_tensors.compressors.pack_quantized.base as pack
import compressed_tensors.quantization as quantization
import numpy as np
import pytest
import torch

from shardport.registry.contracts import TensorInfo, decode_weight, infer_safetensors, run_gates
from shardport.registry.contracts.errors import ContractAmbiguousError

PREFIX = "model.layers.1.self_attn.o_proj"
_DTYPE = {
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
}


def _numpy(tensor):
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _compress(n, k, *, bits, symmetric, strategy, group_size, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
    if strategy == "group":
        weights["group_size"] = group_size
    args = quantization.QuantizationArgs(**weights)
    scheme = quantization.QuantizationScheme(targets=["Linear"], weights=args)
    groups = k // group_size if strategy == "group" else 1
    weight = torch.randn(n, k, generator=generator).to(dtype)
    qmax = (1 << (bits - 1)) - 1
    scale = (weight.float().reshape(n, groups, -1).abs().amax(-1) / qmax + 1e-3).to(dtype)
    state = {"weight": weight, "weight_scale": scale}
    if not symmetric:
        state["weight_zero_point"] = torch.randint(
            -qmax // 2, qmax // 2, (n, groups), generator=generator, dtype=torch.int8
        )
    compressed = pack.PackedQuantizationCompressor.compress(state, scheme)
    reference = pack.PackedQuantizationCompressor.decompress(compressed, scheme)["weight"].float().numpy()
    planes = {f"{PREFIX}.{leaf}": _numpy(tensor) for leaf, tensor in compressed.items()}
    inventory = {
        name: TensorInfo(
            name,
            _DTYPE[compressed[name.rpartition(".")[2]].dtype],
            tuple(compressed[name.rpartition(".")[2]].shape),
        )
        for name in planes
    }
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        }
    }
    return planes, inventory, config, reference, compressed


@pytest.mark.parametrize(
    ("bits", "symmetric", "strategy", "dtype"),
    [
        (4, True, "group", torch.bfloat16),
        (4, False, "group", torch.float16),
        (8, True, "channel", torch.float32),
        (8, False, "group", torch.bfloat16),
        (6, False, "group", torch.float16),  # fields straddle int32 words
        (3, True, "group", torch.bfloat16),
    ],
)
def test_decode_equals_decompressor(bits, symmetric, strategy, dtype):
    n, k, group = 24, 128, 32
    planes, inventory, config, reference, compressed = _compress(
        n, k, bits=bits, symmetric=symmetric, strategy=strategy, group_size=group, dtype=dtype, seed=bits
    )
    shape_values = {f"{PREFIX}.weight_shape": compressed["weight_shape"].tolist()}
    (weight,) = infer_safetensors(config, inventory, shape_values=shape_values)
    assert weight.shape.extents == (n, k)
    assert {plane.role for plane in weight.planes} >= {"codes", "scale", "shape"}
    decoded = decode_weight(weight, planes)
    assert np.array_equal(decoded.view(np.uint32), reference.view(np.uint32))
    assert np.array_equal(decode_weight(weight, planes, rows=[7, 3]), reference[[7, 3]])
    run_gates(weight, planes, inventory)
    grit = weight.contract.grit
    assert not grit.expressible and "offset" in grit.why


def test_channel_strategy_needs_shape_values():
    _, inventory, config, _, _ = _compress(
        8, 64, bits=4, symmetric=True, strategy="channel", group_size=64, dtype=torch.float16, seed=0
    )
    with pytest.raises(ContractAmbiguousError, match="weight_shape"):
        infer_safetensors(config, inventory)
