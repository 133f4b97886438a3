"""``--reference``: every row against each element's honest rounding bound, whatever the weight's name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from quantized import awq_planes, gptq_planes, inventory, quantize_minmax

from shardport.registry.contracts import (
    LogicalWeight,
    TensorInfo,
    decode_weight,
    infer_gguf,
    infer_safetensors,
    reference_gate,
)
from shardport.registry.contracts.errors import ReferenceErrorTooLargeError
from shardport.registry.contracts.witness import relative_error

GPTQ = {
    "quantization_config": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "desc_act": False,
        "checkpoint_format": "gptq",
    }
}
AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}}
SLOTS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
NAMES = [f"model.layers.{i}.{slot}" for i in range(19) for slot in SLOTS][:128]
OLD_BUDGET = 3.5 / 15  # the fixed 4-bit budget the gate used to apply to two rows chosen by name


def _weights(seed: int, n: int = 16, k: int = 512) -> np.ndarray:
    """Uniform rows whose ranges differ by a few percent (a wrong-axis scale is a small error overall)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (n, k)) * (1 + 0.05 * rng.standard_normal((n, 1))) * 0.02).astype(np.float32)


def _gptq(prefix: str, reference: np.ndarray) -> tuple[LogicalWeight, dict[str, np.ndarray]]:
    planes = gptq_planes(quantize_minmax(reference, 32), prefix)
    (weight,) = infer_safetensors(GPTQ, inventory(planes))
    return weight, planes


def _scales_on_the_wrong_axis(weight: LogicalWeight) -> LogicalWeight:
    data = weight.model_dump(mode="json")
    data["contract"]["scales"]["physical_axes"] = list(reversed(data["contract"]["scales"]["physical_axes"]))
    return LogicalWeight.model_validate(data)


def test_scales_on_the_wrong_axis_are_refused_for_every_name() -> None:
    passed_old, refused = 0, 0
    for i, prefix in enumerate(NAMES):
        reference = _weights(i)
        honest, planes = _gptq(prefix, reference)
        reference_gate(honest, planes, reference)  # the honest contract passes
        wrong = _scales_on_the_wrong_axis(honest)  # [G, N] read as [N, G]: G == N == 16
        passed_old += relative_error(decode_weight(wrong, planes), reference) <= OLD_BUDGET
        with pytest.raises(
            ReferenceErrorTooLargeError, match=rf"{prefix}\.weight: row \d+ column \d+ \(group/block \d+\)"
        ):
            reference_gate(wrong, planes, reference)
        refused += 1
    assert refused == len(NAMES) == 128
    assert passed_old > 64  # the old relative budget would have let most of them through


def test_honest_awq_passes() -> None:
    reference = _weights(1, n=64, k=256) * np.linspace(0.5, 2, 256, dtype=np.float32)
    planes = awq_planes(quantize_minmax(reference, 32), "model.layers.0.mlp.up_proj")
    (weight,) = infer_safetensors(AWQ, inventory(planes))
    assert 0 < reference_gate(weight, planes, reference) < 0.2


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16"])
def test_honest_gguf_passes_and_a_scaled_reference_does_not(qtype: str) -> None:
    rng = np.random.default_rng(3)
    reference = (rng.standard_normal((16, 512)) * 0.05).astype(np.float32)
    reference[3, 7] = 0.9  # an outlier: its block's scale is large, and its own error is in bounds
    data = quants.quantize(reference, GGMLQuantizationType[qtype])
    weights = infer_gguf(
        {"general.architecture": "llama"}, [TensorInfo("blk.0.ffn_up.weight", qtype, (16, 512))]
    )
    planes = {weights[0].contract.plane: data}
    reference_gate(weights[0], planes, reference)
    with pytest.raises(ReferenceErrorTooLargeError, match="ffn_up"):
        reference_gate(weights[0], planes, reference * 1.05)  # 5% off everywhere: beyond half a step


def test_every_row_is_compared_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardport.registry.contracts import rounding

    monkeypatch.setattr(rounding, "CHUNK_ELEMENTS", 512)  # one row per chunk
    reference = _weights(5)
    weight, planes = _gptq("model.layers.0.mlp.up_proj", reference)
    bad = reference.copy()
    bad[15, 500] += 0.01  # the last row only
    reference_gate(weight, planes, reference)
    with pytest.raises(ReferenceErrorTooLargeError, match="row 15 column 500 "):
        reference_gate(weight, planes, bad)
