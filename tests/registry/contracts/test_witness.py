"""Decode witnesses: recorded, re-checked, and catching what the gates cannot (a swapped nibble order)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardport.registry.contracts import (
    CellWitness,
    DecodeWitness,
    LogicalWeight,
    check_cells,
    check_witness,
    compare_witness,
    decode_weight,
    infer_safetensors,
    make_witness,
    reference_gate,
    run_gates,
)
from shardport.registry.contracts.errors import ReferenceErrorTooLargeError, WitnessMismatchError
from shardport.registry.contracts.model import cell_positions
from shardport.registry.contracts.witness import witness_alignment, witness_values

PREFIX = "model.layers.4.mlp.up_proj"
AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}}
GPTQ = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}}


def _awq(build, n=32, k=64):
    case = build.make_quantized(n=n, k=k, group_size=32, seed=5)
    planes = build.awq_planes(case, PREFIX)
    (weight,) = infer_safetensors(AWQ, build.inventory(planes))
    return weight, planes


def test_cells_are_a_pure_function_of_seed_and_cover_both_axes(build):
    weight, planes = _awq(build, n=512, k=1024)
    a, b = make_witness(weight, planes, seed=7), make_witness(weight, planes, seed=7)
    assert a == b and make_witness(weight, planes, seed=8).digests != a.digests
    assert witness_alignment(weight) == 32 and a.width == 32
    cells = cell_positions(a)
    rows = sorted({r for r, _, _ in cells})
    starts = sorted({c for _, c, _ in cells})
    assert 16 <= len(cells) <= 18 and rows[-1] == 511 and starts[-1] == 1024 - 32
    assert max(b - a for a, b in itertools.pairwise(rows)) <= 512 // 16  # a row in every 1/16 of N
    assert max(b - a for a, b in itertools.pairwise(starts)) <= 1024 // 16
    assert all(c % 32 == 0 and c1 - c == 32 for _, c, c1 in cells)  # whole cells inside one group


def test_witness_round_trip_and_check(build):
    weight, planes = _awq(build)
    witness = make_witness(weight, planes, seed=11)
    assert isinstance(witness, CellWitness) and witness.columns == 64 and witness.rel_error is None
    restored = CellWitness.model_validate_json(witness.model_dump_json())
    assert restored == witness
    signed = weight.model_copy(update={"witness": witness})
    assert check_witness(signed, planes) == len(cell_positions(witness))
    assert len(witness.model_dump_json()) < 400  # a few hundred bytes per weight


def test_a_box_checks_only_the_cells_inside_it(build):
    weight, planes = _awq(build, n=64, k=256)
    witness = make_witness(weight, planes, seed=3)
    cells = cell_positions(witness)
    inside = [c for c in cells if 16 <= c[0] < 48 and 64 <= c[1] and c[2] <= 192]
    assert check_cells(weight, witness, planes, rows=(16, 48), columns=(64, 192)) == len(inside) > 0
    assert check_cells(weight, witness, planes, rows=(16, 48), columns=(64, 65)) == 0  # no whole cell


def test_swapped_nibble_order_passes_gates_but_fails_the_witness(build):
    weight, planes = _awq(build)
    witness = make_witness(weight, planes, seed=3)
    data = weight.model_dump(mode="json")
    for part in ("codes", "zero_point"):
        data["contract"][part]["packing"]["slot_order"] = list(range(8))  # natural order, as GPTQ
    swapped = LogicalWeight.model_validate(data)
    run_gates(swapped, planes)  # every order is valid bytes
    with pytest.raises(WitnessMismatchError, match="slot order"):
        check_witness(swapped, planes, witness)


def test_legacy_whole_row_witness_still_checked(build):
    import base64
    import hashlib

    weight, planes = _awq(build)
    values = np.ascontiguousarray(decode_weight(weight, planes, [1, 5]), dtype="<f4").tobytes()
    legacy = DecodeWitness(
        seed=1,
        rows=(1, 5),
        columns=64,
        values_f32le=base64.b64encode(values).decode(),
        values_sha256=hashlib.sha256(values).hexdigest(),
        rel_error=None,
    )
    assert check_witness(weight, planes, legacy) == 2
    as_fp16 = witness_values(legacy).astype(np.float16).astype(np.float32)
    with pytest.raises(WitnessMismatchError):
        compare_witness(legacy, as_fp16 + 1e-2, tensor=weight.name)
    compare_witness(legacy, as_fp16, tensor=weight.name, rtol=1e-3, atol=1e-6)
    with pytest.raises(WitnessMismatchError, match="another weight"):
        check_witness(weight, planes, legacy.model_copy(update={"rows": (0, 99)}))


def test_missing_or_foreign_witness_is_refused(build):
    weight, planes = _awq(build)
    with pytest.raises(WitnessMismatchError, match="none"):
        check_witness(weight, planes)
    other, other_planes = _awq(build, n=64)
    foreign = make_witness(other, other_planes, seed=1)
    with pytest.raises(WitnessMismatchError, match="another weight"):
        check_witness(weight, planes, foreign)


def _quantize_gptq(build, reference: np.ndarray, group: int = 32):
    """Honest 4-bit min-max quantization of reference [N, K] into GPTQ planes (zero-1 stored)."""
    n, k = reference.shape
    grouped = reference.T.reshape(k // group, group, n)
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    scales = ((high - low) / 15).astype(np.float16)
    zeros = np.clip(np.round(-low / scales.astype(np.float32)), 1, 15).astype(np.int64)
    q = np.clip(np.round(reference.T / np.repeat(scales, group, 0)) + np.repeat(zeros, group, 0), 0, 15)
    case = {
        "q": q.astype(np.int64),
        "zeros": zeros,
        "scales": scales,
        "g_idx": (np.arange(k) // group).astype(np.int32),
        "bits": 4,
    }
    return build.gptq_planes(case, PREFIX)


def test_reference_gate_catches_a_convention_mislabel(build):
    rng = np.random.default_rng(0)
    reference = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    planes = _quantize_gptq(build, reference)
    (honest,) = infer_safetensors(GPTQ, build.inventory(planes))
    witness = make_witness(honest, planes, seed=2, reference=reference)
    assert witness.rel_error is not None and witness.rel_error < 0.15

    mislabelled = {"weights": {"*": {"zero_point": {"convention": "as_is"}}}}
    (wrong,) = infer_safetensors(GPTQ, build.inventory(planes), declare=mislabelled)
    with pytest.raises(ReferenceErrorTooLargeError, match="zero-point convention"):
        make_witness(wrong, planes, seed=2, reference=reference)
    assert reference_gate(honest, planes, reference) == pytest.approx(witness.rel_error)


def _gguf_layer_weights(hidden: int, inter: int, kv: int, vocab: int):
    from shardport.registry.contracts import TensorInfo, infer_gguf
    from shardport.registry.contracts.gguf_blocks import row_bytes

    shapes = {"token_embd.weight": ((vocab, hidden), "Q8_0")}
    for stem, shape in {
        "attn_q": (hidden, hidden),
        "attn_k": (kv, hidden),
        "attn_v": (kv, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (inter, hidden),
        "ffn_up": (inter, hidden),
        "ffn_down": (hidden, inter),
    }.items():
        shapes[f"blk.0.{stem}.weight"] = (shape, "Q4_1")
    inventory = [TensorInfo(name, qtype, shape) for name, (shape, qtype) in shapes.items()]
    weights = infer_gguf({"general.architecture": "llama"}, inventory)
    planes = {
        name: np.zeros(shape[0] * row_bytes(qtype, shape[1], name), dtype=np.uint8)
        for name, (shape, qtype) in shapes.items()
    }
    return weights, planes


def test_witness_data_is_well_under_a_thousandth_of_a_checkpoint(build):
    """The 135M llama GGUF (30 layers of Q4_1 linears, Q8_0 embeddings 49152 x 576) and a 7B GPTQ layer."""
    weights, planes = _gguf_layer_weights(576, 1536, 192, 49152)
    per = {w.name: len(make_witness(w, planes, seed=i).model_dump_json()) for i, w in enumerate(weights)}
    layer = sum(v for k, v in per.items() if k.startswith("blk."))
    layer_bytes = sum(planes[k].nbytes for k in planes if k.startswith("blk."))
    total = 30 * layer + per["token_embd.weight"]
    checkpoint = 30 * layer_bytes + planes["token_embd.weight"].nbytes
    assert total / checkpoint < 0.0007, (total, checkpoint)  # measured: 0.056%

    prefix = "model.layers.0.mlp.down_proj"
    gptq = {
        f"{prefix}.qweight": np.zeros((11008 // 8, 4096), dtype=np.int32),
        f"{prefix}.qzeros": np.zeros((86, 512), dtype=np.int32),
        f"{prefix}.scales": np.zeros((86, 4096), dtype=np.float16),
        f"{prefix}.g_idx": (np.arange(11008) // 128).astype(np.int32),
    }
    (down,) = infer_safetensors(
        {
            "quantization_config": {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": 128,
                "desc_act": False,
                "checkpoint_format": "gptq",
            }
        },
        build.inventory(gptq),
    )
    size = len(make_witness(down, gptq, seed=1).model_dump_json())
    assert size / sum(p.nbytes for p in gptq.values()) < 0.00002  # measured: 0.001%
