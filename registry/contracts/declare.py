"""User declarations (``--declare``): facts the checkpoint does not state, and contract overrides.

A declare spec is JSON (or an equivalent mapping)::

    {
      "quantization": {"quant_method": "gptq", "checkpoint_format": "gptq"},
      "weights": {"model.layers.*.mlp.down_proj.weight": {"zero_point": {"convention": "as_is"}}}
    }

``quantization`` is laid over the checkpoint's quantization config before inference; ``weights`` maps
``fnmatch`` patterns of logical weight names to partial contracts, deep-merged into the inferred
contract and re-validated. Every weight a declaration touches is labelled ``declared``, with the
declaration in its evidence.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .errors import DeclareSpecError, ScalePlacementError
from .model import SCALE_PLACEMENTS, Contract, Label

_CONTRACT: TypeAdapter[Any] = TypeAdapter(Contract)


class DeclareSpec(BaseModel):
    """A parsed ``--declare`` spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    quantization: dict[str, Any] | None = None
    weights: dict[str, dict[str, Any]] = {}


def parse_declare(spec: str | Mapping[str, Any] | DeclareSpec | None) -> DeclareSpec:
    """Parse a declare spec from JSON text or a mapping; ``None`` declares nothing."""
    if spec is None:
        return DeclareSpec()
    if isinstance(spec, DeclareSpec):
        return spec
    try:
        raw = json.loads(spec) if isinstance(spec, str) else dict(spec)
        return DeclareSpec.model_validate(raw)
    except (ValueError, ValidationError) as error:
        raise DeclareSpecError(
            f"--declare: expected JSON {{'quantization': {{...}}, 'weights': {{pattern: {{...}}}}}}, "
            f"found an invalid spec: {error}"
        ) from error


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def declared_quantization(spec: DeclareSpec) -> list[str]:
    """Evidence lines for the declared quantization keys."""
    if not spec.quantization:
        return []
    return [
        f"--declare quantization.{key}={json.dumps(value)}"
        for key, value in sorted(spec.quantization.items())
    ]


def _check_placement(name: str, data: Mapping[str, Any]) -> None:
    """Refuse a declared scale placement this shardport cannot read, naming the ones it can."""
    scales = data.get("scales")
    placement = scales.get("placement") if isinstance(scales, Mapping) else None
    if placement is not None and placement not in SCALE_PLACEMENTS:
        raise ScalePlacementError(
            name,
            "scales.placement",
            f"one of {', '.join(SCALE_PLACEMENTS)} (C order over the plane's physical_axes; a transposed "
            'plane is row_major with physical_axes ["G", "N"])',
            repr(placement),
            "re-export the scales in a supported placement (e.g. un-swizzle a 128x4 tiled plane)",
        )


def apply_weight_declarations(name: str, contract: Any, spec: DeclareSpec) -> Any:
    """Deep-merge every matching ``weights`` declaration into ``contract``; relabel it ``declared``."""
    matches = [
        (pattern, body)
        for pattern, body in sorted(spec.weights.items())
        if fnmatch.fnmatchcase(name, pattern)
    ]
    if not matches:
        return contract
    data: dict[str, Any] = contract.model_dump(mode="json")
    evidence = [
        f"--declare weights[{pattern}]={json.dumps(body, sort_keys=True)}" for pattern, body in matches
    ]
    for _, body in matches:
        data = _merge(data, body)
    _check_placement(name, data)
    prior = [
        line for line in data.get("label", {}).get("evidence", []) if not line.startswith("--declare weights")
    ]
    data["label"] = Label(kind="declared", evidence=(*evidence, *prior)).model_dump(mode="json")
    try:
        return _CONTRACT.validate_python(data)
    except ValidationError as error:
        raise DeclareSpecError(
            f"--declare weights for {name}: the merged contract is invalid: {error}"
        ) from error
