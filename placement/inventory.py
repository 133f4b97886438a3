"""What placement plans over: logical weights, the tensors that hold their bytes, and model dims.

:class:`Inventory` gathers the manifest's ``weights`` and ``tensors`` sections and ``model.params``;
:func:`resolve_dims` reads the dims placement needs (layers, experts, heads, kv heads, head_dim) from
the parameters, accepting Hugging Face and GGUF spellings, and checks them against the bindings.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from shardport.registry.artifact.manifest import Manifest, TensorEntry
from shardport.registry.contracts.model import LogicalWeight
from shardport.registry.families.llama import CONFIG_KEYS as _KEYS
from shardport.registry.families.llama import PARAM_ALIASES as _PARAM_ALIASES
from shardport.registry.families.llama import param_keys

from .errors import InventoryError

PARAM_ALIASES = _PARAM_ALIASES
"""Parameter spellings (the model family's table, which the tile grid reads the same way)."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """Logical weights, their tensors (byte ranges), and the model parameters (a config-like dict)."""

    weights: tuple[LogicalWeight, ...]
    tensors: tuple[TensorEntry, ...]
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Inventory:
        """The manifest's ``weights``, ``tensors`` and ``model.params``."""
        if manifest.weights is None or manifest.tensors is None:
            missing = "weights" if manifest.weights is None else "tensors"
            raise InventoryError(
                f"manifest has no {missing!r} section: placement needs every tensor's byte range and "
                "every logical weight's contract and binding; push the checkpoint again with this shardport"
            )
        return cls(tuple(manifest.weights), tuple(manifest.tensors), dict(manifest.model.params))


Source: TypeAlias = (
    "Manifest | Inventory | tuple[Sequence[LogicalWeight], Sequence[TensorEntry], Mapping[str, Any]]"
)


def inventory_of(source: Source) -> Inventory:
    """Accept a manifest, an :class:`Inventory` or a ``(weights, tensors, params)`` tuple."""
    if isinstance(source, Inventory):
        return source
    if isinstance(source, Manifest):
        return Inventory.from_manifest(source)
    weights, tensors, params = source
    return Inventory(tuple(weights), tuple(tensors), dict(params))


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The model dims placement needs; ``None`` where neither the parameters nor the names say."""

    num_layers: int
    num_experts: int
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None


def param(params: Mapping[str, Any], name: str) -> int | None:
    """Look a dim up under its aliases (exact key, or a GGUF ``<arch>.<alias>`` key)."""
    for key in param_keys(params, name)[:1]:
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InventoryError(
                f"model parameter {key}={value!r}: expected a positive integer ({name}); "
                "fix the model parameters in the manifest"
            )
        return value
    return None


def _expert_extent(weights: Sequence[LogicalWeight]) -> tuple[int, str] | None:
    """Expert count from stacked ``[E, N, K]`` weights (all must agree) and one such weight's name."""
    stacked = {w.name: w.shape.extents[0] for w in weights if w.shape.axes[0] == "E"}
    if len(set(stacked.values())) > 1:
        raise InventoryError(f"stacked expert weights disagree on the expert count: {stacked}")
    return next(((count, name) for name, count in stacked.items()), None)


def resolve_dims(weights: Sequence[LogicalWeight], params: Mapping[str, Any]) -> ModelDims:
    """Read the dims from the parameters and check them against the weights' bindings."""
    layers = [w.binding.layer for w in weights if w.binding.layer is not None]
    num_layers = param(params, "num_layers") or 0
    if layers and max(layers) >= num_layers:
        if num_layers:
            raise InventoryError(
                f"a weight is bound to layer {max(layers)} but the parameters say {num_layers} layers "
                "(layers 0.." + f"{num_layers - 1}); fix {_KEYS['layers']} or the tensor names"
            )
        num_layers = max(layers) + 1
    experts = [w.binding.expert for w in weights if w.binding.expert is not None]
    stacked = _expert_extent(weights)
    num_experts = param(params, "num_experts") or 0
    found = max([e + 1 for e in experts] + ([stacked[0]] if stacked else []), default=0)
    if found > num_experts:
        if num_experts:
            raise InventoryError(
                f"weights name {found} experts but the parameters say {num_experts}; "
                f"fix {_KEYS['experts']} or the tensor names"
            )
        num_experts = found
    if stacked and stacked[0] != num_experts:
        raise InventoryError(
            f"{stacked[1]}: stacks {stacked[0]} experts but the model has {num_experts}; "
            f"fix {_KEYS['experts']} or the tensor"
        )
    heads = param(params, "num_heads")
    kv_heads = param(params, "num_kv_heads") or heads
    head_dim = param(params, "head_dim")
    hidden = param(params, "hidden")
    if head_dim is None and heads and hidden:
        if hidden % heads:
            raise InventoryError(
                f"{_KEYS['hidden']}={hidden} is not a multiple of {_KEYS['heads']}={heads} "
                f"({hidden}/{heads} = {hidden / heads:g}); state head_dim in the model parameters"
            )
        head_dim = hidden // heads
    if heads and kv_heads and heads % kv_heads:
        raise InventoryError(
            f"{_KEYS['heads']}={heads} is not a multiple of {_KEYS['kv_heads']}={kv_heads}; "
            "grouped-query attention needs whole query groups per kv head"
        )
    return ModelDims(num_layers, num_experts, heads, kv_heads, head_dim)


def tensors_by_name(inventory: Inventory) -> dict[str, TensorEntry]:
    """Index the tensors by name, refusing duplicates, inverted or overlapping byte ranges."""
    out: dict[str, TensorEntry] = {}
    for entry in inventory.tensors:
        if entry.name in out:
            raise InventoryError(f"tensor {entry.name} is listed twice in the tensors section")
        if entry.end < entry.start:
            raise InventoryError(
                f"tensor {entry.name}: byte range [{entry.start}, {entry.end}) ends before it starts"
            )
        out[entry.name] = entry
    ordered = sorted(out.values(), key=lambda e: (e.file, e.start, e.end))
    for a, b in itertools.pairwise(ordered):
        if a.file == b.file and b.start < a.end:
            raise InventoryError(
                f"tensors {a.name} [{a.start}, {a.end}) and {b.name} [{b.start}, {b.end}) overlap in "
                f"{a.file}; a checkpoint's tensors hold disjoint bytes"
            )
    owners: dict[str, str] = {}
    for weight in inventory.weights:
        for plane in weight.planes:
            if plane.tensor not in out:
                raise InventoryError(
                    f"{weight.name}: plane {plane.tensor} ({plane.role}) is not in the tensors section; "
                    "the manifest lost a tensor — push the checkpoint again"
                )
            if plane.tensor in owners:
                raise InventoryError(
                    f"tensor {plane.tensor} is a plane of both {owners[plane.tensor]} and {weight.name}"
                )
            owners[plane.tensor] = weight.name
    return out
