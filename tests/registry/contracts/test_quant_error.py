"""E_quant at push (issue 27): the operator error of a decode against its float reference, per weight."""

from __future__ import annotations

import numpy as np
from quantized import honest_gptq

from shardport.registry.artifact.manifest import ContainerInfo, Manifest, QuantizationInfo
from shardport.registry.contracts import decode_weight, reference_gate
from shardport.registry.contracts.quant_error import TOKENS, golden_activations, measure_quant_error


def test_honest_weight_e_quant_is_the_operator_error_and_within_the_rounding_bound() -> None:
    weight, planes, w, _ = honest_gptq()
    sums, q = measure_quant_error(weight, planes, w, seed=9)
    x = golden_activations(256, 9)
    assert x.shape == (TOKENS, 256) and np.array_equal(x, golden_activations(256, 9))
    delta = decode_weight(weight, planes).astype(np.float64) - w
    e_quant = np.linalg.norm(x @ delta.T) / np.linalg.norm(x @ w.astype(np.float64).T)
    assert abs(q.e_quant - e_quant) <= 1e-5 * e_quant
    assert q.max_abs == float(f"{np.abs(delta).max():.6g}")
    assert sums.rel_frobenius == reference_gate(weight, planes, w)  # the witness's rel_error, unchanged
    # measured 0.0825 against 0.1395: a uniform error over ±half a step is ~0.58 of the bound
    assert 0.4 * q.tolerance < q.e_quant < 0.7 * q.tolerance and q.clipped == 0 and q.tokens == TOKENS
    assert measure_quant_error(weight, planes, w, seed=9)[1] == q  # deterministic
    assert measure_quant_error(weight, planes, w, seed=10)[1].e_quant != q.e_quant  # the seed is the X


def test_clipped_outliers_pass_the_element_gate_but_not_e_quant() -> None:
    """Floats beyond the top code are clipped (the gate lets them through); in aggregate they show."""
    weight, planes, w, top = honest_gptq()
    outliers = np.where(top, w + 1.0, w).astype(np.float32)
    _, q = measure_quant_error(weight, planes, outliers, seed=9)
    assert q.clipped == int(top.sum()) > 0
    assert q.e_quant > q.tolerance  # measured 0.19 against 0.127


def test_manifest_records_it_only_when_measured() -> None:
    weight, planes, w, _ = honest_gptq()
    _, q = measure_quant_error(weight, planes, w, seed=9)
    plain = Manifest(container=ContainerInfo(kind="safetensors"), files=[])
    assert b"quant_error" not in plain.to_bytes()  # pushes without --reference keep their bytes
    measured = plain.model_copy(
        update={"quantization": QuantizationInfo(family="gptq", quant_error={weight.name: q})}
    )
    again = Manifest.from_bytes(measured.to_bytes())
    assert again.quantization.quant_error == {weight.name: q} and again.digest() == measured.digest()
