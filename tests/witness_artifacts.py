"""Checkpoints for the witness tests: a GPTQ llama layer and GGUF models with the 135M llama's shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from quantized import gptq_planes, quantize_minmax
from safetensors.numpy import save_file


def gptq_llama(root: Path) -> dict[str, Any]:
    """hidden 768 (24 heads of 32, 8 kv heads), intermediate 2048, GPTQ 4-bit group 32."""
    rng = np.random.default_rng(0)
    hidden, inter = 768, 2048
    tensors: dict[str, np.ndarray] = {"model.norm.weight": np.ones(hidden, dtype=np.float16)}
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (256, hidden),
        "self_attn.v_proj": (256, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    for slot, (n, k) in shapes.items():
        case = quantize_minmax(rng.standard_normal((n, k)).astype(np.float32), 32)
        tensors.update(gptq_planes(case, f"model.layers.0.{slot}"))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(root / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "quantization_config": {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 32,
            "desc_act": False,
            "checkpoint_format": "gptq",
        },
    }
    (root / "config.json").write_text(json.dumps(config))
    return config


def gguf_model(root: Path, *, experts: int = 0) -> dict[str, Any]:
    """The 135M llama's shapes (hidden 576, 9 heads / 3 kv, intermediate 1536; vocab cut to 1152):
    Q4_1 linears, Q8_0 embeddings; with ``experts``, stacked Q8_0 expert weights ``[E, N, K]``."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(1)
    hidden, inter, vocab = 576, 1536, 1152
    w = gguf.GGUFWriter(str(root / "model.gguf"), "llama")
    w.add_block_count(1)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(9)
    w.add_head_count_kv(3)
    q41, q80 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0

    def add(name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> None:
        w.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), qtype), raw_dtype=qtype)

    add("token_embd.weight", (vocab, hidden), q80)
    shapes = {
        "attn_q": (hidden, hidden),
        "attn_k": (192, hidden),
        "attn_v": (192, hidden),
        "attn_output": (hidden, hidden),
    }
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
        shapes.update(
            {
                "ffn_gate_exps": (experts, 256, 512),
                "ffn_up_exps": (experts, 256, 512),
                "ffn_down_exps": (experts, 512, 256),
            }
        )
    else:
        shapes.update({"ffn_gate": (inter, hidden), "ffn_up": (inter, hidden), "ffn_down": (hidden, inter)})
    for stem, shape in shapes.items():
        add(f"blk.0.{stem}.weight", shape, q80 if stem.endswith("exps") else q41)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {}
