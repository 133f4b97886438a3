"""Does the inventory match the architecture it claims? (llama family, dense and MoE).

Pure: takes the config parameters and the inferred weights' graph bindings. A missing or an
unexpected operator slot goes to the :class:`~shardport.registry.formats.notes.Notes` collector: a note by
default (the rule is ours, a heuristic of the llama family; a loader checks its own inventory when it
binds the weights), :class:`InventoryMismatchError` under ``strict``. Architectures this module does
not know are not checked (the result says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shardport.registry.families.llama import (
    ARCHITECTURES,
    ATTENTION_SLOTS,
    CONFIG_KEYS,
    DENSE_LAYER_SLOTS,
    EMBED_SLOT,
    HEAD_SLOT,
    MLP_SLOTS,
    MOE_EXPERT_SLOTS,
    MOE_ROUTER_SLOT,
    NORM_SLOT,
    NORM_SLOTS,
    OPTIONAL_SLOTS,
)
from shardport.registry.formats.notes import Notes

from .errors import InventoryMismatchError
from .model import LogicalWeight

LLAMA_FAMILY = ARCHITECTURES
__all__ = ["DENSE_LAYER_SLOTS", "LLAMA_FAMILY", "MOE_EXPERT_SLOTS", "OPTIONAL_SLOTS", "check_architecture"]


def _count(architecture: str | None, params: Mapping[str, Any], key: str) -> int:
    """``params[key]`` as a count: a non-negative integer (config.json is untrusted input)."""
    value = params.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InventoryMismatchError(
            str(architecture), f"config.json {key}", "a non-negative integer", repr(value)[:80]
        )
    return value


def expected_slots(params: Mapping[str, Any]) -> set[tuple[int | None, str, int | None]]:
    """(layer, slot, expert) triples a llama-family checkpoint with these parameters must hold."""
    layers = _count(None, params, CONFIG_KEYS["layers"])
    experts = _count(None, params, CONFIG_KEYS["experts"])
    out: set[tuple[int | None, str, int | None]] = {(None, EMBED_SLOT, None), (None, NORM_SLOT, None)}
    if not params.get(CONFIG_KEYS["tied_embeddings"], False):
        out.add((None, HEAD_SLOT, None))
    for layer in range(layers):
        for slot in ATTENTION_SLOTS + NORM_SLOTS:
            out.add((layer, slot, None))
        if experts:
            out.add((layer, MOE_ROUTER_SLOT, None))
            out |= {(layer, s, e) for s in MOE_EXPERT_SLOTS for e in range(experts)}
        else:
            out |= {(layer, s, None) for s in MLP_SLOTS}
    return out


def _held_slots(weights: Iterable[LogicalWeight], experts: int) -> set[tuple[int | None, str, int | None]]:
    """The ``(layer, slot, expert)`` slots the weights fill.

    GGUF stacks a layer's experts in one ``[E, N, K]`` tensor: it fills experts ``0..E-1`` (E is the
    tensor's own extent, bounded by its bytes, so this enumerates no more than the file holds).
    """
    out: set[tuple[int | None, str, int | None]] = set()
    for w in weights:
        b = w.binding
        if b.slot in MOE_EXPERT_SLOTS and b.expert is None and len(w.shape.extents) == 3:
            out |= {(b.layer, b.slot, e) for e in range(min(experts, w.shape.extents[0]))}
        else:
            out.add((b.layer, b.slot, b.expert))
    return out


def check_architecture(
    architecture: str | None, params: Mapping[str, Any], weights: Iterable[LogicalWeight], *, notes: Notes
) -> tuple[str, ...]:
    """Compare the weights' bindings with what the architecture needs; mismatches go to ``notes``.

    Returns short remarks of what was checked (``unchecked: …`` for unknown architectures).
    """
    if architecture not in LLAMA_FAMILY or CONFIG_KEYS["layers"] not in params:
        return (f"unchecked: architecture {architecture!r} has no inventory rule",)
    layers = _count(architecture, params, CONFIG_KEYS["layers"])
    experts = _count(architecture, params, CONFIG_KEYS["experts"])
    have = _held_slots(weights, experts)
    if layers * max(experts, 1) > len(have):  # more slots than weights: never enumerate them (memory)
        notes.add(  # raised under --strict
            InventoryMismatchError(
                str(architecture),
                "inventory",
                f"{layers} layers{f' of {experts} experts' if experts else ''} (config.json)",
                f"{len(have)} weights in the checkpoint",
                "the checkpoint lost tensors, or its config (layers, experts) is wrong",
            )
        )
        return (f"{architecture}: config.json names {layers} layers, more than the {len(have)} weights hold",)
    need = expected_slots(params)
    missing = sorted(need - have, key=str)
    extra = sorted((h for h in have - need if h[1] not in OPTIONAL_SLOTS), key=str)
    if missing:
        notes.add(
            InventoryMismatchError(
                str(architecture),
                "inventory",
                f"{len(need)} operator slots",
                f"{len(missing)} missing: {missing[:6]}",
                "the checkpoint lost tensors, or its config (layers, experts, tied embeddings) is wrong",
            )
        )
    if extra:
        notes.add(
            InventoryMismatchError(
                str(architecture),
                "inventory",
                "only the architecture's operator slots",
                f"{len(extra)} unexpected: {extra[:6]}",
                "remove them, or push without --strict",
            )
        )
    if not notes.strict:
        return (
            f"{architecture}: {len(need) - len(missing)}/{len(need)} operator slots present, "
            f"{len(extra)} unexpected (not strict)",
        )
    return (f"{architecture}: {len(need)} operator slots present",)
