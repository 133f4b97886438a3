"""Split rules per operator slot (llama family) and the pp stages a weight belongs to.

The operator tables are :mod:`shardport.registry.families.llama`'s (the registry cuts tiles by them).

=====================================  =========  ====  ============================================
operator (last part of the slot)       rule       axis  shared dim (its split points agree)
=====================================  =========  ====  ============================================
``q_proj``                             column     N     ``layers.<l>.<prefix>.heads``
``k_proj``, ``v_proj``                 kv_heads   N     ``layers.<l>.<prefix>.kv``
``gate_proj``, ``up_proj``, ``w1/w3``  column     N     ``layers.<l>.<prefix>[.<e>].intermediate``
``o_proj``                             row        K     ``layers.<l>.<prefix>.heads``
``down_proj``, ``w2``                  row        K     ``layers.<l>.<prefix>[.<e>].intermediate``
``embed_tokens``                       vocab      N     ``embed``
``lm_head``                            vocab      N     ``lm_head``
bias of a column / kv operator         as its op  N     as its operator
bias of a row operator, norms, router  replicate  -     -
(other 1-D tensors, unknown slots)
``qkv_proj``, ``gate_up_proj`` (fused) refused under tp > 1 (:class:`UnsupportedSplitError`)
=====================================  =========  ====  ============================================

Experts (``binding.expert``, or the ``E`` axis of stacked weights) follow the same rules inside the
tp group of the ep rank that owns them (:func:`.topology.expert_owner`).

Stages: a weight with a layer goes to ``stage_of_layer``; ``embed_tokens`` to the first stage,
``lm_head`` and the final ``norm`` to the last; a tied embedding serves both (its alias's stage too);
any other layer-less weight is needed on every stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardport.registry.contracts.model import GraphBinding
from shardport.registry.families.llama import (
    COLUMN_OPS,
    FIRST_STAGE_SLOTS,
    FUSED_OPS,
    KV_OPS,
    LAST_STAGE_SLOTS,
    ROW_OPS,
    VOCAB_SLOTS,
    VOCAB_SPLIT_KEYS,
)

from .errors import UnsupportedSplitError
from .plan import Rule
from .topology import stage_of_layer

# the slot facts are the model family's (registry.families), by which the registry cuts tiles too
_COLUMN, _ROW, _KV, _VOCAB, _FUSED = COLUMN_OPS, ROW_OPS, KV_OPS, VOCAB_SLOTS, FUSED_OPS


@dataclass(frozen=True, slots=True)
class SlotRule:
    """The rule for one weight: how it splits, along which axis, and which dim it shares."""

    rule: Rule
    axis: Literal["N", "K"] | None
    dim: str | None
    reason: str


def slot_rule(name: str, binding: GraphBinding, axes: tuple[str, ...], tp: int) -> SlotRule:
    """The split rule of a weight from its operator slot and logical axes."""
    slot = binding.slot
    bias = slot.endswith(".bias")
    stem = slot.removesuffix(".bias")
    prefix, _, op = stem.rpartition(".")
    where = f"layers.{binding.layer}.{prefix}" if binding.layer is not None else prefix
    if binding.expert is not None:
        where += f".{binding.expert}"
    if op in _FUSED or stem in _FUSED:
        if tp > 1:
            raise UnsupportedSplitError(
                f"{name}: fused operator {slot!r} packs several projections along N; splitting it needs "
                "per-projection split points — unfuse the checkpoint or use tp=1"
            )
        return SlotRule("replicate", None, None, f"fused {op} at tp=1")
    if op in _KV and (len(axes) >= 2 or bias):
        return SlotRule("kv_heads", "N", f"{where}.kv", f"{op}: split by kv heads")
    if op in _COLUMN and (len(axes) >= 2 or bias):
        return SlotRule("column", "N", f"{where}.{_COLUMN[op]}", f"{op}: column-parallel")
    if op in _ROW and len(axes) >= 2 and not bias:
        return SlotRule("row", "K", f"{where}.{_ROW[op]}", f"{op}: row-parallel")
    if op in _ROW and bias:
        return SlotRule("replicate", None, None, f"{op} bias: added once after the row-parallel reduction")
    if stem in _VOCAB and len(axes) >= 2:
        return SlotRule("vocab", "N", VOCAB_SPLIT_KEYS[stem], f"{stem}: vocab-parallel")
    if len(axes) == 1:
        return SlotRule("replicate", None, None, f"{slot}: 1-D tensor, replicated")
    return SlotRule("replicate", None, None, f"{slot}: no split rule for this slot, replicated")


def _top_stage(slot: str, pp: int) -> tuple[int, ...]:
    if slot in FIRST_STAGE_SLOTS:
        return (0,)
    if slot in LAST_STAGE_SLOTS:
        return (pp - 1,)
    return tuple(range(pp))


def stage_uses(binding: GraphBinding, num_layers: int, pp: int) -> dict[int, tuple[str, ...]]:
    """The pp stages that need a weight, each with the operator slots it serves there."""
    if binding.layer is not None:
        return {stage_of_layer(binding.layer, num_layers, pp): (binding.slot,)}
    uses: dict[int, tuple[str, ...]] = {}
    slots = [binding.slot] + ([binding.tied_alias] if binding.tied_alias else [])
    for slot in slots:
        for stage in _top_stage(slot, pp):
            uses[stage] = (*uses.get(stage, ()), slot)
    return uses
