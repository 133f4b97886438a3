"""Tensor name stems of a decoder layer's weights, by operator, in Hugging Face and GGUF checkpoints.

Torch-free: the driver's inventory check (:mod:`shardport.deploy.contract`) reads them at plan time.
"""

from __future__ import annotations

HF_STEMS: dict[str, str] = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "input_norm": "input_layernorm",
    "post_norm": "post_attention_layernorm",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "router": "block_sparse_moe.gate",
}
GGUF_STEMS: dict[str, str] = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "input_norm": "attn_norm",
    "post_norm": "ffn_norm",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
    "router": "ffn_gate_inp",
}


def layer_stem(layer: int, op: str, gguf: bool) -> str:
    """Layer ``layer``'s ``op`` stem: ``blk.3.attn_q`` (GGUF), ``model.layers.3.self_attn.q_proj``."""
    return f"blk.{layer}.{GGUF_STEMS[op]}" if gguf else f"model.layers.{layer}.{HF_STEMS[op]}"
