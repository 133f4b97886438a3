"""Tensor name stems of a decoder layer's weights, by operator: the llama family's (a re-export).

The names live in :mod:`shardport.registry.families.llama`; import them from there.
"""

from __future__ import annotations

from shardport.registry.families.llama import GGUF_STEMS, HF_STEMS, layer_stem

__all__ = ["GGUF_STEMS", "HF_STEMS", "layer_stem"]
