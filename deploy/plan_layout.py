"""The graph layout of a tp rank from the placement plan's split decisions (what bring-up loads).

The plan splits each layer's query heads (``layers.<l>.self_attn.heads``, rows or columns of
``head_dim``), kv heads (``layers.<l>.self_attn.kv``) and the vocabulary (``embed``, ``lm_head``); the
graph runs one layout for every layer, so the layers must agree (they do for the llama family: one
extent and the same alignment units per layer), and the embedding and head split the vocabulary alike.
"""

from __future__ import annotations

from shardport.placement.plan import Plan
from shardport.registry.contracts.graph import GraphContract
from shardport.registry.families import llama

from .errors import GraphLayoutError
from .graph.layout import Range, RankLayout, single_layout


def _one(what: str, found: dict[str, tuple[Range, ...]]) -> tuple[Range, ...] | None:
    distinct = set(found.values())
    if len(distinct) > 1:
        raise GraphLayoutError(f"{what}: the plan splits them differently per layer: {found}")
    return distinct.pop() if distinct else None


def layout_from_plan(plan: Plan, contract: GraphContract, tp_rank: int) -> RankLayout:
    """``tp_rank``'s :class:`RankLayout` from ``plan.splits`` (tp = 1: the whole model)."""
    tp = plan.topology.tp
    if tp == 1:
        return single_layout(contract)
    d = contract.head_dim
    q: dict[str, tuple[Range, ...]] = {}
    kv: dict[str, tuple[Range, ...]] = {}
    vocab: dict[str, tuple[Range, ...]] = {}
    for split in plan.splits:
        heads = tuple((a // d, b // d) for a, b in split.ranges)
        if split.key.endswith(llama.QUERY_HEADS_SPLIT):
            q[split.key] = heads
        elif split.key.endswith(llama.KV_HEADS_SPLIT):
            kv[split.key] = heads
        elif split.key in llama.VOCAB_SPLITS:
            vocab[split.key] = split.ranges
    q_heads, kv_heads, rows = _one("query heads", q), _one("kv heads", kv), _one("vocabulary rows", vocab)
    if q_heads is None or kv_heads is None or rows is None:
        raise GraphLayoutError(
            f"plan at tp={tp} has no split of the query heads, kv heads or vocabulary "
            f"(splits: {[s.key for s in plan.splits][:8]}); the graph needs all three"
        )
    layout = RankLayout(tp_rank, q_heads, kv_heads, rows)
    layout.check(contract)
    return layout
