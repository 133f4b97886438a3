"""The runtime graph: a llama-family decoder (dense and MoE) run tensor-, expert- and pipeline-parallel.

Consumes a :class:`~shardport.registry.contracts.graph.GraphContract`, a rank's layout (its heads and
vocabulary rows), its operators (pluggable linears: packed kernels on a bring-up, float weights in
tests) and a mesh of collectives (torch.distributed or a single process). Produces logits, greedy
tokens and parity records against the float32 reference (:mod:`.reference`). Imports torch and the
contract types only; no placement, loader or kernels. The names load lazily (importing the package
imports no torch: :mod:`.layout` and :mod:`.stems` are torch-free, for the driver's plan-time checks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardport._lazy import lazy_exports

if TYPE_CHECKING:
    from .collectives import Group, LocalGroup, Mesh, Pipe
    from .layout import RankLayout
    from .model import Generation, KVCache, RankModel
    from .reference import (
        CacheCheck,
        FloatModel,
        Parity,
        TpSplit,
        check_cache,
        compare,
        random_model,
        reference_model,
        shard,
        tp_split,
    )
    from .rope import gguf_qk_rows, permute_qk_for_gguf, unpermute_gguf_qk
    from .weights import Attention, Experts, Layer, Linear, Lookup, Mlp, RankWeights, float_linear

_HOME = {
    **dict.fromkeys(("Group", "LocalGroup", "Mesh", "Pipe"), "collectives"),
    **dict.fromkeys(("Generation", "KVCache", "RankModel"), "model"),
    **dict.fromkeys(
        (
            "CacheCheck",
            "FloatModel",
            "Parity",
            "TpSplit",
            "check_cache",
            "compare",
            "random_model",
            "reference_model",
            "shard",
            "tp_split",
        ),
        "reference",
    ),
    **dict.fromkeys(("gguf_qk_rows", "permute_qk_for_gguf", "unpermute_gguf_qk"), "rope"),
    **dict.fromkeys(
        ("Attention", "Experts", "Layer", "Linear", "Lookup", "Mlp", "RankWeights", "float_linear"), "weights"
    ),
    "RankLayout": "layout",
}

__getattr__ = lazy_exports(__name__, globals(), _HOME)

__all__ = [
    "Attention",
    "CacheCheck",
    "Experts",
    "FloatModel",
    "Generation",
    "Group",
    "KVCache",
    "Layer",
    "Linear",
    "LocalGroup",
    "Lookup",
    "Mesh",
    "Mlp",
    "Parity",
    "Pipe",
    "RankLayout",
    "RankModel",
    "RankWeights",
    "TpSplit",
    "check_cache",
    "compare",
    "float_linear",
    "gguf_qk_rows",
    "permute_qk_for_gguf",
    "random_model",
    "reference_model",
    "shard",
    "tp_split",
    "unpermute_gguf_qk",
]
