"""Hostile cases: each wrong contract or damaged plane is refused with its own error."""

from __future__ import annotations

import numpy as np
import pytest

from shardport.registry.contracts import LogicalWeight, decode_weight, infer_safetensors, run_gates
from shardport.registry.contracts.errors import (
    CodeRangeError,
    ContractError,
    GroupIndexError,
    PermutationError,
    PlaneMissingError,
    PlaneShapeError,
    PlaneSizeError,
    ScaleNarrowingError,
    ScaleShapeError,
    ScaleSignError,
    TailGroupError,
    ZeroPointRangeError,
)
from shardport.registry.errors import VerificationError

PREFIX = "model.layers.0.self_attn.k_proj"
NAME = f"{PREFIX}.weight"
QCONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}


def _gptq(build, *, n=16, k=64, desc_act=False, act_order=False, declare=None, **changes):
    case = build.make_quantized(n=n, k=k, group_size=32, act_order=act_order)
    planes = build.gptq_planes(case, PREFIX)
    planes.update(changes)
    config = {"quantization_config": {**QCONFIG, "desc_act": desc_act}}
    (weight,) = infer_safetensors(config, build.inventory(planes), declare=declare)
    return weight, planes


def _with(weight: LogicalWeight, contract_changes: dict, planes: list | None = None) -> LogicalWeight:
    data = weight.model_dump(mode="json")
    data["contract"] = _merge(data["contract"], contract_changes)
    if planes is not None:
        data["planes"] = planes
    return LogicalWeight.model_validate(data)


def _merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def test_errors_are_refused_input_with_tensor_and_expected_vs_found(build):
    weight, planes = _gptq(build)
    planes[f"{PREFIX}.scales"] = -planes[f"{PREFIX}.scales"]
    with pytest.raises(ScaleSignError) as caught:
        run_gates(weight, planes)
    error = caught.value
    assert isinstance(error, ContractError) and isinstance(error, VerificationError) and error.exit_code == 5
    assert error.tensor == NAME and "expected positive" in str(error) and "found" in str(error)


def test_signed_scales_declared_signed_pass(build):
    weight, planes = _gptq(build, declare={"weights": {"*": {"scales": {"sign": "signed"}}}})
    planes[f"{PREFIX}.scales"] = -planes[f"{PREFIX}.scales"]
    run_gates(weight, planes)


def test_dropped_scale_plane(build):
    weight, planes = _gptq(build)
    del planes[f"{PREFIX}.scales"]
    with pytest.raises(PlaneMissingError, match="scales"):
        run_gates(weight, planes)
    with pytest.raises(PlaneMissingError):
        decode_weight(weight, planes)
    with pytest.raises(PlaneMissingError):
        infer_safetensors({"quantization_config": QCONFIG}, build.inventory(planes))


@pytest.mark.parametrize("shape", [(2, 1), (1, 16)])
def test_scale_that_only_broadcasts_is_refused(build, shape):
    weight, planes = _gptq(build)
    bad = np.ones(shape, dtype=np.float16)
    with pytest.raises(ScaleShapeError, match="broadcasts"):
        _gptq(build, **{f"{PREFIX}.scales": bad})
    with pytest.raises(ScaleShapeError):
        run_gates(weight, planes, build.inventory({**planes, f"{PREFIX}.scales": bad}))


def test_e8m0_narrowing_of_fp16_scales(build):
    weight, planes = _gptq(build)
    narrowed = _with(weight, {"scales": {"format": "e8m0", "storage": "raw_bits"}})
    with pytest.raises(ScaleNarrowingError, match="narrow"):
        run_gates(narrowed, planes)
    with pytest.raises(ScaleNarrowingError):
        _gptq(build, declare={"weights": {"*": {"scales": {"format": "e8m0", "storage": "raw_bits"}}}})


def test_wrong_tail_group(build):
    weight, planes = _gptq(build, k=80)  # ceil(80 / 32) = 3 groups
    run_gates(weight, planes)
    floor_scales = planes[f"{PREFIX}.scales"][:2]
    with pytest.raises(TailGroupError, match="partial group"):
        run_gates(weight, planes, build.inventory({**planes, f"{PREFIX}.scales": floor_scales}))
    with pytest.raises(TailGroupError, match="tail_rule"):
        run_gates(_with(weight, {"scales": {"tail_rule": "exact"}}), planes)
    with pytest.raises(TailGroupError, match="group_count"):
        run_gates(_with(weight, {"scales": {"group_count": 2, "physical_shape": [2, 16]}}), planes)


def test_g_idx_out_of_range_or_inconsistent(build):
    weight, planes = _gptq(build, desc_act=True, act_order=True)
    run_gates(weight, planes)
    g_idx = planes[f"{PREFIX}.g_idx"].copy()
    g_idx[3] = 7
    with pytest.raises(GroupIndexError, match="in \\[0, 2\\)"):
        run_gates(weight, {**planes, f"{PREFIX}.g_idx": g_idx})
    with pytest.raises(GroupIndexError):
        decode_weight(weight, {**planes, f"{PREFIX}.g_idx": g_idx})
    lopsided = np.zeros(64, dtype=np.int32)
    lopsided[-1] = 1
    with pytest.raises(GroupIndexError, match="members of group 0"):
        run_gates(weight, {**planes, f"{PREFIX}.g_idx": lopsided})
    sequential, _ = _gptq(build, desc_act=False, act_order=True)
    with pytest.raises(GroupIndexError, match="sequential"):
        run_gates(sequential, planes)


def test_permutation_must_be_a_bijection(build):
    weight, planes = _gptq(build)
    perm_name = f"{PREFIX}.perm"
    refs = [
        *weight.model_dump(mode="json")["planes"],
        {"role": "perm", "tensor": perm_name, "dtype": "I32", "shape": [64]},
    ]
    permuted = _with(
        weight,
        {
            "permutation": {
                "kind": "plane",
                "plane": perm_name,
                "physical_dtype": "I32",
                "physical_shape": [64],
                "axis": "K",
                "direction": "logical_to_stored",
            }
        },
        refs,
    )
    order = np.random.default_rng(0).permutation(64).astype(np.int32)
    run_gates(permuted, {**planes, perm_name: order})
    assert np.array_equal(
        decode_weight(permuted, {**planes, perm_name: order}), decode_weight(weight, planes)[:, order]
    )
    order[5] = order[6]
    with pytest.raises(PermutationError):
        run_gates(permuted, {**planes, perm_name: order})
    with pytest.raises(PermutationError):
        decode_weight(permuted, {**planes, perm_name: order})


def test_truncated_plane(build):
    weight, planes = _gptq(build)
    raw = planes[f"{PREFIX}.qweight"].view(np.uint8).reshape(-1)
    run_gates(weight, {**planes, f"{PREFIX}.qweight": raw})  # raw bytes of the right size are fine
    with pytest.raises(PlaneSizeError, match="truncated"):
        run_gates(weight, {**planes, f"{PREFIX}.qweight": raw[:-4]})
    with pytest.raises(PlaneSizeError):
        decode_weight(weight, {**planes, f"{PREFIX}.qweight": raw[:-4]})


def test_plane_of_the_wrong_dtype(build):
    weight, planes = _gptq(build)
    widened = planes[f"{PREFIX}.scales"].astype(np.float32)
    with pytest.raises(PlaneShapeError, match="float32"):
        decode_weight(weight, {**planes, f"{PREFIX}.scales": widened})


def test_codes_out_of_range(build):
    weight, planes = _gptq(build)
    case_codes = np.random.default_rng(1).integers(0, 16, size=(64, 16)).astype(np.uint8)
    codes_name = f"{PREFIX}.codes"
    refs = [p for p in weight.model_dump(mode="json")["planes"] if p["role"] != "codes"]
    refs.append({"role": "codes", "tensor": codes_name, "dtype": "U8", "shape": [64, 16]})
    unpacked = _with(
        weight,
        {
            "codes": {
                "plane": codes_name,
                "physical_dtype": "U8",
                "physical_shape": [64, 16],
                "packing": {"axis": "none", "container_bits": 8, "slot_order": [0]},
            }
        },
        refs,
    )
    run_gates(unpacked, {**planes, codes_name: case_codes})
    assert np.array_equal(
        decode_weight(unpacked, {**planes, codes_name: case_codes}),
        decode_weight(unpacked, {**planes, codes_name: case_codes}, rows=range(16)),
    )
    case_codes[9, 3] = 17
    with pytest.raises(CodeRangeError, match=r"\[0, 15\]"):
        run_gates(unpacked, {**planes, codes_name: case_codes})


def test_padding_bits_must_be_zero(build):
    """A bitstream plane whose last container's unused bits are set is refused."""
    n = 4  # K = 36 four-bit fields = 144 bits in 5 words: 16 padding bits per row
    codes = np.random.default_rng(2).integers(0, 16, size=(n, 40))
    codes[:, 36:] = 0
    packed = build.pack_along_columns(codes, 4)
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 12,
                    },
                }
            },
        }
    }
    planes = {f"{PREFIX}.weight_packed": packed, f"{PREFIX}.weight_scale": np.ones((n, 3), dtype=np.float16)}
    (weight,) = infer_safetensors(config, build.inventory(planes))
    assert weight.shape.extents == (4, 36)
    run_gates(weight, planes)
    assert np.array_equal(decode_weight(weight, planes), (codes[:, :36] - 8).astype(np.float32))
    dirty = packed.copy()
    dirty[2, 4] |= np.int32(1 << 20)
    with pytest.raises(CodeRangeError, match="padding"):
        run_gates(weight, {**planes, f"{PREFIX}.weight_packed": dirty})


def test_zero_point_out_of_range(build):
    """GPTQ v1 wraps a zero of 0 to a stored 15, which decodes as 16: outside the u4 code range."""
    weight, planes = _gptq(build)
    zeros = np.full((2, 16), 15, dtype=np.int64)
    planes[f"{PREFIX}.qzeros"] = build.pack_along_columns(zeros, 4)
    with pytest.raises(ZeroPointRangeError, match="minus_one"):
        run_gates(weight, planes)
