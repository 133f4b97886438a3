"""Infer numeric contracts from a checkpoint's config and tensor inventory.

Inputs are plain: the checkpoint's ``config.json`` as a dict (its ``quantization_config`` is read),
optionally a separate ``quantize_config.json``/``quant_config.json`` dict, and the tensor inventory
(:class:`~.model.TensorInfo` by name, as a container parser reports it). The output is one
:class:`~.model.LogicalWeight` per logical weight (witness still empty): companion tensors (qweight,
qzeros, scales, g_idx; weight_packed, weight_scale, weight_zero_point, weight_shape) bound to their
weight by role, a graph binding from the names, the contract labelled ``inferred`` with the evidence
used, and its GRIT record.

A contract that cannot be inferred unambiguously raises :class:`~.errors.ContractAmbiguousError`
naming the declaration that would settle it; declarations (:mod:`.declare`) are applied on top and
label the weight ``declared``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from pydantic import ValidationError

from shardport.registry.families.llama import (
    CONFIG_KEYS,
    GGUF_ARCHITECTURE_KEY,
    GGUF_EMBED,
    HEAD_SLOT,
    gguf_head_tied,
    hf_has_head,
    is_hf_embedding,
)
from shardport.registry.formats.elements import ELEMENTS

from . import microscaling, producers
from .declare import DeclareSpec, apply_weight_declarations, declared_quantization, parse_declare
from .errors import ContractAmbiguousError, DeclaredPlaneError, UnsupportedContractError, schema_error
from .gates import check_contract_shape
from .grade import grade_contract
from .model import (
    AffineIntContract,
    FloatContract,
    FloatFormat,
    GgmlType,
    GgufBlockContract,
    Label,
    LogicalShape,
    LogicalWeight,
    MicroscaleContract,
    PermutationPlane,
    PlaneRef,
    PlaneRole,
    TensorInfo,
    contract_planes,
)
from .names import gguf_binding, hf_binding

#: float weight dtype → its format: every safetensors float the reference decoder widens as a weight.
_FLOAT = {
    e.name: fmt
    for fmt in get_args(FloatFormat)
    for e in ELEMENTS.values()
    if e.safetensors and e.float_format == fmt
}
_COMPANIONS = {
    "gptq": ("qweight", "qzeros", "scales", "g_idx", "perm"),
    "awq": ("qweight", "qzeros", "scales"),
    "compressed-tensors": (
        "weight_packed",
        "weight_scale",
        "weight_zero_point",
        "weight_shape",
        "weight_g_idx",
        "weight_global_scale",
    ),
}
_QUANTIZED_LEAVES = ("qweight", "qzeros", "weight_packed")
_CT_FORMATS = ("pack-quantized", *microscaling.CT_FORMATS)
_GGUF_TYPES = get_args(GgmlType)
_DECLARE_HINT = (
    'declare {"quantization": {"quant_method": "gptq", "checkpoint_format": "gptq", "bits": 4, "group_size": '
    '128}} (qzeros store zero-1, natural nibble order) or {"quantization": {"quant_method": "awq", '
    '"version": "gemm", "bits": 4, "group_size": 128}} (qzeros store the zero as is, nibble order '
    "[0,2,4,6,1,3,5,7]), "
    "with the checkpoint's own bits and group_size"
)

Inventory = Mapping[str, TensorInfo] | Iterable[TensorInfo]


def _by_name(inventory: Inventory) -> dict[str, TensorInfo]:
    if isinstance(inventory, Mapping):
        return dict(inventory)
    return {info.name: info for info in inventory}


def _settings(
    config: Mapping[str, Any],
    quantize_config: Mapping[str, Any] | None,
    spec: DeclareSpec,
    quantized: Sequence[str],
) -> producers.Settings | None:
    """Decide the producer from the declarations and the configs, with evidence."""
    evidence: list[str] = []
    params: dict[str, Any] = {}
    section = config.get("quantization_config")
    if isinstance(section, Mapping):
        params.update(section)
        evidence.append(f"config.json quantization_config.quant_method={section.get('quant_method')}")
    elif quantize_config is not None:
        params.update(quantize_config)
        if "quant_method" in quantize_config:
            evidence.append(f"quantize_config.quant_method={quantize_config['quant_method']}")
        elif {"w_bit", "q_group_size"} <= quantize_config.keys():
            params["quant_method"] = "awq"
            evidence.append("quant_config.json has w_bit/q_group_size (AutoAWQ)")
        elif {"bits", "group_size", "desc_act"} <= quantize_config.keys():
            params["quant_method"] = "gptq"
            evidence.append("quantize_config.json has bits/group_size/desc_act (AutoGPTQ)")
    if spec.quantization:
        params.update(spec.quantization)
    method = str(params.get("quant_method", "")).lower().replace("_", "-")
    if not method:
        if quantized:
            raise ContractAmbiguousError(
                quantized[0],
                "quantization.quant_method",
                "a record of the producer",
                "quantized planes but no quantization config",
                _DECLARE_HINT,
            )
        return None
    if method == "gptq":
        fmt = params.get("checkpoint_format")
        evidence.append(f"checkpoint_format={fmt}" if fmt else "checkpoint_format absent: gptq (v1, zero-1)")
    declared = declared_quantization(spec)
    label = (
        Label(kind="declared", evidence=(*declared, *evidence))
        if declared
        else Label(kind="inferred", evidence=tuple(evidence))
    )
    return producers.Settings(method=method, params=params, label=label)


def _modules(names: Iterable[str], leaves: Sequence[str]) -> dict[str, dict[str, str]]:
    """Group companion tensors by module prefix: ``{prefix: {leaf: tensor name}}``."""
    out: dict[str, dict[str, str]] = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        if leaf in leaves and prefix:
            out.setdefault(prefix, {})[leaf] = name
    return {prefix: found for prefix, found in out.items() if set(found) & set(_QUANTIZED_LEAVES)}


def _float_weight(info: TensorInfo, label: Label) -> tuple[LogicalShape, FloatContract]:
    if info.dtype not in _FLOAT or not 1 <= len(info.shape) <= 3:
        raise UnsupportedContractError(
            info.name,
            "dtype/shape",
            f"a float ({'/'.join(_FLOAT)}) tensor of rank 1..3, or a companion of a quantized weight",
            f"{info.dtype} {list(info.shape)}",
        )
    contract = FloatContract.model_validate(
        {
            "family": "float",
            "plane": info.name,
            "physical_dtype": info.dtype,
            "format": _FLOAT[info.dtype],
            "decode_law": "float_upcast",
            "label": label,
            "grit": producers.PENDING,
        }
    )
    return _logical_shape(info.name, info.shape), contract


def _logical_shape(name: str, extents: tuple[int, ...]) -> LogicalShape:
    """Name the axes of a rank-1..3 tensor: ``(N,)``, ``(N, K)``, ``(E, N, K)``."""
    axes = {1: ("N",), 2: ("N", "K"), 3: ("E", "N", "K")}[len(extents)]
    if any(extent < 1 for extent in extents):
        raise UnsupportedContractError(
            name, "shape", "positive extents (a weight with at least one element)", list(extents)
        )
    return LogicalShape.model_validate({"axes": axes, "extents": extents})


def _ct_weights(params: Mapping[str, Any], module: str) -> Mapping[str, Any]:
    """Pick the compressed-tensors config group whose targets match the module."""
    if str(params.get("format", "pack-quantized")) not in _CT_FORMATS:
        raise UnsupportedContractError(
            f"{module}.weight", "quantization_config.format", " or ".join(_CT_FORMATS), params.get("format")
        )
    candidates = []
    groups = params.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not all(isinstance(g, Mapping) for g in groups.values()):
        raise UnsupportedContractError(
            f"{module}.weight",
            "quantization_config.config_groups",
            "an object of group objects",
            repr(groups),
        )
    for group in groups.values():
        targets = group.get("targets", [])
        targets = [str(target) for target in (targets if isinstance(targets, list) else [targets])]
        regex = [t[3:] for t in targets if t.startswith("re:")]
        if any(re.match(pattern, module) for pattern in regex) or (not regex and targets):
            weights = group.get("weights") or {}
            if not isinstance(weights, Mapping):
                raise UnsupportedContractError(
                    f"{module}.weight", "config_groups.*.weights", "an object", repr(weights)
                )
            candidates.append(weights)
    unique = {repr(sorted(weights.items())) for weights in candidates}
    if len(unique) != 1:
        raise ContractAmbiguousError(
            f"{module}.weight",
            "quantization_config.config_groups",
            "exactly one weights scheme for the module",
            f"{len(unique)} schemes",
            'declare {"weights": {"<name>": {...}}} or fix config_groups targets',
        )
    return candidates[0]


def _finish(
    name: str, shape: LogicalShape, planes: list[PlaneRef], contract: Any, binding: Any, spec: DeclareSpec
) -> LogicalWeight:
    contract = apply_weight_declarations(name, contract, spec)
    _check_declared_planes(name, contract, planes)
    contract = contract.model_copy(update={"grit": grade_contract(contract)})
    check_contract_shape(name, contract, shape)
    try:
        return LogicalWeight(
            name=name, shape=shape, planes=tuple(planes), contract=contract, binding=binding, witness=None
        )
    except ValidationError as error:
        raise schema_error(name, error) from error


def _check_declared_planes(name: str, contract: Any, planes: list[PlaneRef]) -> None:
    """Every plane the (declared) contract reads is one of the weight's own tensors, in that role.

    A declaration changes how a weight's tensors are read; it cannot bind a tensor the weight does not
    hold (an absent one, another weight's, or one of its own in a second role).
    """
    bound = {plane.tensor: plane.role for plane in planes}
    for tensor, role in contract_planes(contract).items():
        if bound.get(tensor) == role:
            continue
        found = f"bound as its {bound[tensor]} plane" if tensor in bound else "not one of its tensors"
        raise DeclaredPlaneError(
            name,
            f"declared {role} plane {tensor}",
            f"one of the weight's own tensors in that role ({', '.join(sorted(bound))})",
            found,
            "declare only planes the checkpoint stores for this weight, in their own role",
        )


def _plane_refs(
    contract: Any, tensors: Mapping[str, TensorInfo], extra: Mapping[str, PlaneRole]
) -> list[PlaneRef]:
    roles = dict(contract_planes(contract))
    roles.update(extra)
    return [
        PlaneRef(role=role, tensor=t, dtype=tensors[t].dtype, shape=tensors[t].shape)
        for t, role in sorted(roles.items())
    ]


def _quantized_weight(
    prefix: str,
    found: Mapping[str, str],
    settings: producers.Settings,
    tensors: Mapping[str, TensorInfo],
    spec: DeclareSpec,
    architecture: str | None,
    shape_values: Mapping[str, Sequence[int]] | None,
) -> LogicalWeight:
    """Build one quantized logical weight from its module's companion tensors."""
    leaves = {leaf: tensors[name] for leaf, name in found.items()}
    name = f"{prefix}.weight"
    contract: AffineIntContract | MicroscaleContract
    if settings.method == "gptq":
        (n, k), contract = producers.gptq(prefix, leaves, settings)
    elif settings.method == "awq":
        (n, k), contract = producers.awq(prefix, leaves, settings)
    else:
        values = (shape_values or {}).get(found.get("weight_shape", ""))
        weights = _ct_weights(settings.params, prefix)
        fmt = str(settings.params.get("format", "pack-quantized"))
        if fmt in microscaling.CT_FORMATS:
            (n, k), contract = microscaling.compressed_tensors_fp4(
                prefix, leaves, weights, fmt, settings.label
            )
        else:
            (n, k), contract = producers.compressed_tensors(prefix, leaves, weights, values, settings.label)
    extra: dict[str, PlaneRole] = {found["weight_shape"]: "shape"} if "weight_shape" in found else {}
    if "perm" in found:
        extra[found["perm"]] = "perm"
    planes = _plane_refs(contract, tensors, extra)
    shape = _logical_shape(name, (n, k))
    weight = _finish(name, shape, planes, contract, hf_binding(name, architecture, None), spec)
    permutation = getattr(weight.contract, "permutation", None)
    if "perm" in found and not isinstance(permutation, PermutationPlane):
        raise ContractAmbiguousError(
            name,
            "permutation",
            f"a declared direction for the permutation plane {found['perm']}",
            "a perm plane and no declaration",
            f'declare {{"weights": {{"{name}": {{"permutation": {{"kind": "plane", "plane": '
            f'"{found["perm"]}", "physical_dtype": "{tensors[found["perm"]].dtype}", "physical_shape": '
            f'{list(tensors[found["perm"]].shape)}, "axis": "K", "direction": "stored_to_logical"}}}}}}}} '
            "(perm[s] is the logical column at stored position s) or direction logical_to_stored",
        )
    return weight


def infer_safetensors(
    config: Mapping[str, Any],
    inventory: Inventory,
    *,
    quantize_config: Mapping[str, Any] | None = None,
    declare: str | Mapping[str, Any] | DeclareSpec | None = None,
    shape_values: Mapping[str, Sequence[int]] | None = None,
) -> tuple[LogicalWeight, ...]:
    """Infer the logical weights of a safetensors checkpoint (float, GPTQ, AWQ, compressed-tensors).

    ``shape_values`` gives the contents of small shape tensors (compressed-tensors ``weight_shape``)
    where the caller has read them; per-channel compressed-tensors weights need them.
    """
    spec = parse_declare(declare)
    tensors = _by_name(inventory)
    quantized = sorted(n for n in tensors if n.rpartition(".")[2] in _QUANTIZED_LEAVES)
    settings = _settings(config, quantize_config, spec, quantized)
    architectures = config.get("architectures") or [config.get("model_type")]
    architecture = str(architectures[0]) if architectures and architectures[0] else None
    modules = (
        _modules(tensors, _COMPANIONS[settings.method]) if settings and settings.method in _COMPANIONS else {}
    )
    if quantized and not modules:
        raise UnsupportedContractError(
            quantized[0],
            "quantization.quant_method",
            "gptq, awq or compressed-tensors",
            settings.method if settings else None,
        )
    bound = {name for found in modules.values() for name in found.values()}
    tied_alias = _tied_alias(config, tensors)
    weights = [
        _quantized_weight(prefix, found, settings, tensors, spec, architecture, shape_values)
        for prefix, found in sorted(modules.items())
        if settings is not None
    ]
    label = Label(kind="inferred", evidence=("float dtype in the tensor inventory",))
    for name, info in sorted(tensors.items()):
        if name in bound:
            continue
        shape, contract = _float_weight(info, label)
        alias = tied_alias if is_hf_embedding(name) else None
        weights.append(
            _finish(
                name,
                shape,
                _plane_refs(contract, tensors, {}),
                contract,
                hf_binding(name, architecture, alias),
                spec,
            )
        )
    return tuple(weights)


def _tied_alias(config: Mapping[str, Any], tensors: Mapping[str, TensorInfo]) -> str | None:
    """``lm_head`` when the checkpoint ties it to the embeddings (declared, or the head is absent)."""
    tied = config.get(CONFIG_KEYS["tied_embeddings"], True)
    return HEAD_SLOT if not hf_has_head(tensors) and tied else None


def infer_gguf(
    metadata: Mapping[str, Any],
    inventory: Inventory,
    *,
    declare: str | Mapping[str, Any] | DeclareSpec | None = None,
) -> tuple[LogicalWeight, ...]:
    """Infer the logical weights of a GGUF file: each tensor's ggml type is its declared format.

    ``inventory`` shapes are logical element shapes in row-major order (ggml ``ne`` reversed).
    """
    spec = parse_declare(declare)
    tensors = _by_name(inventory)
    architecture = metadata.get(GGUF_ARCHITECTURE_KEY)
    architecture = str(architecture) if architecture is not None else None
    tied = HEAD_SLOT if gguf_head_tied(tensors) else None
    weights: list[LogicalWeight] = []
    for name, info in sorted(tensors.items()):
        if info.dtype not in _GGUF_TYPES or not 1 <= len(info.shape) <= 3:
            raise UnsupportedContractError(
                name,
                "ggml_type",
                f"one of {', '.join(_GGUF_TYPES)} (rank 1..3)",
                f"{info.dtype} {list(info.shape)}",
            )
        label = Label(kind="inferred", evidence=(f"gguf tensor type {info.dtype}",))
        contract = GgufBlockContract.model_validate(
            {
                "family": "gguf_block",
                "ggml_type": info.dtype,
                "plane": name,
                "decode_law": "ggml_block",
                "label": label,
                "grit": producers.PENDING,
            }
        )
        shape = _logical_shape(name, info.shape)
        alias = tied if name == GGUF_EMBED else None
        weights.append(
            _finish(
                name,
                shape,
                _plane_refs(contract, tensors, {}),
                contract,
                gguf_binding(name, architecture, alias),
                spec,
            )
        )
    return tuple(weights)
