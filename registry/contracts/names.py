"""Graph bindings from tensor names: Hugging Face (llama family) and GGUF naming schemes.

``model.layers.3.self_attn.q_proj.weight`` binds to layer 3, slot ``self_attn.q_proj``;
``blk.3.attn_q.weight`` to the same. Experts (``mlp.experts.7.down_proj``) give an expert index and
the slot ``mlp.experts.down_proj``. Names outside these patterns keep their own stem as the slot. The
names and slots are the llama family's (:mod:`shardport.registry.families.llama`).
"""

from __future__ import annotations

from shardport.registry.families.llama import GGUF_SLOTS, parse_gguf_name, parse_hf_name

from .model import GraphBinding

__all__ = ["GGUF_SLOTS", "gguf_binding", "hf_binding"]


def hf_binding(name: str, architecture: str | None, tied_alias: str | None) -> GraphBinding:
    """Bind a Hugging Face logical weight name; ``bias`` tensors get the slot ``<op>.bias``."""
    layer, slot, expert = parse_hf_name(name)
    return GraphBinding(
        architecture=architecture, layer=layer, slot=slot, expert=expert, tied_alias=tied_alias
    )


def gguf_binding(name: str, architecture: str | None, tied_alias: str | None) -> GraphBinding:
    """Bind a GGUF tensor name (``blk.N.<stem>.weight``, ``token_embd.weight``…)."""
    layer, slot = parse_gguf_name(name)
    return GraphBinding(architecture=architecture, layer=layer, slot=slot, expert=None, tied_alias=tied_alias)
