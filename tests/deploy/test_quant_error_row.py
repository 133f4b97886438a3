"""The E_quant evidence row (issue 27): from the manifest's push --reference record, apart from E_kernel."""

from __future__ import annotations

import numpy as np
from quantized import honest_gptq

from shardport.deploy.quant_error import NAME, quant_error_row
from shardport.registry.artifact.manifest import ContainerInfo, Manifest, QuantizationInfo
from shardport.registry.contracts.model import QuantError
from shardport.registry.contracts.quant_error import measure_quant_error


def manifest(family: str, quant_error: dict[str, QuantError] | None) -> Manifest:
    quantization = QuantizationInfo(family=family, quant_error=quant_error)
    return Manifest(container=ContainerInfo(kind="safetensors"), quantization=quantization, files=[])


def measured() -> tuple[QuantError, QuantError]:
    """An honest weight's record and the same weight's against a reference with clipped outliers."""
    weight, planes, w, top = honest_gptq()
    _, honest = measure_quant_error(weight, planes, w, seed=9)
    _, clipped = measure_quant_error(weight, planes, np.where(top, w + 1.0, w).astype(np.float32), seed=9)
    return honest, clipped


def test_within_tolerance_passes_with_the_largest_e_quant() -> None:
    honest, _ = measured()
    weight, planes, w, _ = honest_gptq(seed=6)
    _, other = measure_quant_error(weight, planes, w, seed=9)
    row = quant_error_row(manifest("gptq", {"a.weight": honest, "b.weight": other}))
    assert row["level"] == "L3" and row["name"] == NAME
    assert row["status"] == "pass" and row["passed"] is True
    top = max(honest, other, key=lambda q: q.e_quant)
    assert row["value"] == top.e_quant and row["tolerance"] == top.tolerance
    assert "2 weights" in row["detail"] and "0 clipped" in row["detail"] and "‖B‖" in row["tolerance_source"]


def test_a_weight_over_its_tolerance_fails_naming_it() -> None:
    honest, clipped = measured()
    row = quant_error_row(manifest("gptq", {"a.weight": honest, "b.weight": clipped}))
    assert row["status"] == "fail" and row["passed"] is False
    assert row["value"] == clipped.e_quant > row["tolerance"] == clipped.tolerance
    assert "over tolerance: b.weight" in row["detail"] and "a.weight (" not in row["detail"]


def test_not_applicable_says_why() -> None:
    for family, why in (("gptq", "pushed without --reference"), ("none", "nothing was quantized")):
        row = quant_error_row(manifest(family, None))
        assert row["status"] == "not applicable" and row["passed"] is None and row["value"] is None
        assert why in row["detail"], row
