"""Graph bindings from tensor names: Hugging Face (llama family) and GGUF naming schemes.

``model.layers.3.self_attn.q_proj.weight`` binds to layer 3, slot ``self_attn.q_proj``;
``blk.3.attn_q.weight`` to the same. Experts (``mlp.experts.7.down_proj``) give an expert index and
the slot ``mlp.experts.down_proj``. Names outside these patterns keep their own stem as the slot.
"""

from __future__ import annotations

import re

from .model import GraphBinding

# Whole-string matches (``fullmatch``); ``[0-9]``, not ``\d`` (which also matches non-ASCII digits).
_HF_LAYER = re.compile(
    r"(?:model\.|transformer\.|language_model\.model\.)?(?:layers|h|blocks)\.([0-9]+)\.(.+)"
)
_HF_TOP = re.compile(r"(?:model\.|transformer\.|language_model\.model\.)?(.+)")
_EXPERT = re.compile(r"(.*?)\.experts\.([0-9]+)\.(.+)")
_GGUF_LAYER = re.compile(r"blk\.([0-9]+)\.(.+)")

#: GGUF tensor stem → Hugging Face operator slot.
GGUF_SLOTS: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "token_embd": "embed_tokens",
    "output": "lm_head",
    "output_norm": "norm",
}


def _split_suffix(stem: str) -> tuple[str, str]:
    """Split ``x.q_proj.weight`` into (``x.q_proj``, ``weight``)."""
    head, _, leaf = stem.rpartition(".")
    if leaf in ("weight", "bias") and head:
        return head, leaf
    return stem, ""


def hf_binding(name: str, architecture: str | None, tied_alias: str | None) -> GraphBinding:
    """Bind a Hugging Face logical weight name; ``bias`` tensors get the slot ``<op>.bias``."""
    stem, leaf = _split_suffix(name)
    layer: int | None = None
    match = _HF_LAYER.fullmatch(stem)
    if match is not None:
        layer, rest = int(match.group(1)), match.group(2)
    else:
        top = _HF_TOP.fullmatch(stem)
        rest = top.group(1) if top is not None else stem
    expert: int | None = None
    expert_match = _EXPERT.fullmatch(rest)
    if expert_match is not None:
        rest = f"{expert_match.group(1)}.experts.{expert_match.group(3)}"
        expert = int(expert_match.group(2))
    slot = f"{rest}.bias" if leaf == "bias" else rest
    return GraphBinding(
        architecture=architecture, layer=layer, slot=slot, expert=expert, tied_alias=tied_alias
    )


def gguf_binding(name: str, architecture: str | None, tied_alias: str | None) -> GraphBinding:
    """Bind a GGUF tensor name (``blk.N.<stem>.weight``, ``token_embd.weight``…)."""
    stem, leaf = _split_suffix(name)
    layer: int | None = None
    match = _GGUF_LAYER.fullmatch(stem)
    if match is not None:
        layer, stem = int(match.group(1)), match.group(2)
    slot = GGUF_SLOTS.get(stem, stem)
    slot = f"{slot}.bias" if leaf == "bias" else slot
    return GraphBinding(architecture=architecture, layer=layer, slot=slot, expert=None, tied_alias=tied_alias)
