"""The small dense llama graph contract the runtime-graph tests share."""

from __future__ import annotations

from typing import Any

from shardport.registry.contracts.graph import GraphContract

#: 2 layers, hidden 144 (6 heads of 24, 3 kv heads: GQA), intermediate 200, odd vocab 1001.
DENSE_FIELDS: dict[str, Any] = dict(
    architecture="LlamaForCausalLM",
    source="config.json",
    layers=2,
    hidden=144,
    heads=6,
    kv_heads=3,
    head_dim=24,
    intermediate=200,
    vocab=1001,
    rope_base=10000.0,
    rope_pairs="half",
    norm_eps=1e-5,
    tied_embeddings=False,
)
DENSE = GraphContract(**DENSE_FIELDS)


def contract(**changes: Any) -> GraphContract:
    """:data:`DENSE` with ``changes``, validated again."""
    return GraphContract(**{**DENSE_FIELDS, **changes})
