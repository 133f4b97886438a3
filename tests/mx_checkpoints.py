"""MXFP4 / NVFP4 planes built with compressed-tensors' own compressors, and its decompression of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import compressed_tensors.quantization as quantization
import numpy as np
import torch
from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from safetensors.torch import save_file

from shardport.registry.contracts import TensorInfo

FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized"}
_COMPRESSOR = {"nvfp4": NVFP4PackedCompressor, "mxfp4": MXFP4PackedCompressor}
_WEIGHTS: dict[str, dict[str, Any]] = {
    "nvfp4": {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "strategy": "tensor_group",
        "group_size": 16,
    },
    "mxfp4": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32},
}
DTYPE = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32", torch.float16: "F16"}


def scheme(kind: str) -> quantization.QuantizationScheme:
    return quantization.QuantizationScheme(
        targets=["Linear"], weights=quantization.QuantizationArgs(**_WEIGHTS[kind])
    )


def compress(kind: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """``weight`` ``[N, K]`` quantized as the observers would (scales stored exactly) and compressed."""
    n, k = weight.shape
    block = _WEIGHTS[kind]["group_size"]
    amax = weight.float().reshape(n, k // block, block).abs().amax(-1).clamp(min=1e-4)
    state: dict[str, torch.Tensor] = {"weight": weight}
    if kind == "nvfp4":
        global_scale = (448.0 * 6.0 / weight.float().abs().max()).reshape(1)
        state["weight_scale"] = (amax / 6.0 * global_scale).to(torch.float8_e4m3fn).float()
        state["weight_global_scale"] = global_scale
    else:
        state["weight_scale"] = torch.exp2(torch.floor(torch.log2(amax / 6.0)))
    return dict(_COMPRESSOR[kind].compress(state, scheme(kind)))


def decompress(kind: str, compressed: dict[str, torch.Tensor]) -> np.ndarray:
    """compressed-tensors' own decompression, widened to float32 (exact: it is bfloat16)."""
    weight = _COMPRESSOR[kind].decompress(dict(compressed), scheme(kind))["weight"]
    assert weight.dtype == torch.bfloat16
    return weight.float().numpy()


def numpy_planes(prefix: str, compressed: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The planes as a safetensors reader gives them (F8 as its raw bytes)."""
    out = {}
    for leaf, tensor in compressed.items():
        t = tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor
        out[f"{prefix}.{leaf}"] = t.numpy()
    return out


def inventory(prefix: str, compressed: dict[str, torch.Tensor]) -> dict[str, TensorInfo]:
    return {
        f"{prefix}.{leaf}": TensorInfo(f"{prefix}.{leaf}", DTYPE[t.dtype], tuple(t.shape))
        for leaf, t in compressed.items()
    }


def config(kind: str) -> dict[str, Any]:
    return {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": FORMATS[kind],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(_WEIGHTS[kind])}},
        }
    }


Q = "model.layers.0.self_attn.q_proj"  # column parallel: rank r holds rows [r*N/2, (r+1)*N/2)
DOWN = "model.layers.0.mlp.down_proj"  # row parallel: rank r holds columns [r*K/2, (r+1)*K/2)
HIDDEN, INTER = 128, 256
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 1,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}


def fp4_llama(folder: Path, kind: str) -> dict[str, dict[str, torch.Tensor]]:
    """A one-layer llama whose q_proj and down_proj are ``kind`` (compressed-tensors), the rest fp16."""
    generator = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    quantized = {
        Q: compress(kind, randn(HIDDEN, HIDDEN).to(torch.bfloat16)),
        DOWN: compress(kind, randn(HIDDEN, INTER).to(torch.bfloat16)),
    }
    tensors = {f"{module}.{leaf}": t for module, planes in quantized.items() for leaf, t in planes.items()}
    tensors |= {
        "model.embed_tokens.weight": randn(64, HIDDEN).half(),
        "model.layers.0.self_attn.k_proj.weight": randn(32, HIDDEN).half(),
        "model.layers.0.self_attn.o_proj.weight": randn(HIDDEN, HIDDEN).half(),
        "model.layers.0.mlp.up_proj.weight": randn(INTER, HIDDEN).half(),
        "model.layers.0.input_layernorm.weight": torch.ones(HIDDEN),
    }
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(LLAMA | config(kind)))
    return quantized
