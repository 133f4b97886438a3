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

from shardport.registry.formats.notes import Notes

from .errors import InventoryMismatchError
from .model import LogicalWeight

LLAMA_FAMILY = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "MixtralForCausalLM",
        "llama",
        "mistral",
        "qwen2",
    }
)
DENSE_LAYER_SLOTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)
MOE_EXPERT_SLOTS = ("mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj")
OPTIONAL_SLOTS = frozenset(
    {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "rotary_emb.inv_freq"}
)


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
    layers = _count(None, params, "num_hidden_layers")
    experts = _count(None, params, "num_local_experts")
    out: set[tuple[int | None, str, int | None]] = {(None, "embed_tokens", None), (None, "norm", None)}
    if not params.get("tie_word_embeddings", False):
        out.add((None, "lm_head", None))
    for layer in range(layers):
        for slot in DENSE_LAYER_SLOTS[:4] + DENSE_LAYER_SLOTS[7:]:
            out.add((layer, slot, None))
        if experts:
            out.add((layer, "mlp.gate", None))
            out |= {(layer, s, e) for s in MOE_EXPERT_SLOTS for e in range(experts)}
        else:
            out |= {(layer, s, None) for s in DENSE_LAYER_SLOTS[4:7]}
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
    if architecture not in LLAMA_FAMILY or "num_hidden_layers" not in params:
        return (f"unchecked: architecture {architecture!r} has no inventory rule",)
    layers = _count(architecture, params, "num_hidden_layers")
    experts = _count(architecture, params, "num_local_experts")
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
