"""MXFP4 / NVFP4: compress with compressed-tensors, decode with ours bit for bit, and every gate refuses."""

from __future__ import annotations

import grit
import numpy as np
import pytest
import torch
from mx_checkpoints import compress, config, decompress, inventory, numpy_planes

from shardport.registry.contracts import TensorInfo, decode_weight, infer_safetensors, run_gates
from shardport.registry.contracts.declare import apply_weight_declarations, parse_declare
from shardport.registry.contracts.errors import (
    ContractSchemaError,
    DeclareSpecError,
    GlobalScaleError,
    PermutationError,
    PlaneDtypeError,
    PlaneMissingError,
    PlaneSizeError,
    ScaleFormatError,
    ScaleNarrowingError,
    ScalePlacementError,
    ScaleShapeError,
    ScaleSignError,
    ScaleValueError,
    TailGroupError,
    UnsupportedContractError,
)
from shardport.registry.contracts.gates import check_contract_shape
from shardport.registry.contracts.model import GlobalScaleNone, LogicalWeight, PlaneRef
from shardport.registry.contracts.rounding import reference_gate

PREFIX = "model.layers.0.mlp.down_proj"
WEIGHT = f"{PREFIX}.weight"
N, K = 24, 128


def _case(kind: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    original = torch.randn(N, K, generator=generator).to(torch.bfloat16)
    compressed = compress(kind, original)
    return original, compressed, numpy_planes(PREFIX, compressed), inventory(PREFIX, compressed)


@pytest.fixture(scope="module", params=["nvfp4", "mxfp4"])
def case(request):
    kind = request.param
    original, compressed, planes, inv = _case(kind)
    return kind, original, compressed, planes, inv, decompress(kind, compressed)


def test_decode_equals_compressed_tensors_bit_for_bit(case):
    kind, original, _, planes, inv, reference = case
    (weight,) = infer_safetensors(config(kind), inv)
    contract = weight.contract
    assert contract.family == "mx_block" and contract.scheme == kind
    assert contract.codes.encoding == "e2m1" and contract.decode_law == "mx_round_bf16"
    assert contract.scales.format == ("e4m3" if kind == "nvfp4" else "e8m0")
    assert {p.role for p in weight.planes} == (
        {"codes", "scale", "global_scale"} if kind == "nvfp4" else {"codes", "scale"}
    )
    decoded = decode_weight(weight, planes)
    assert decoded.shape == (N, K) and len(np.unique(decoded)) > 20
    assert np.array_equal(decoded.view(np.uint32), reference.view(np.uint32))
    assert np.array_equal(decode_weight(weight, planes, rows=[5, 0]), reference[[5, 0]])
    report = run_gates(weight, planes, inv)
    assert "values.global_scale" in report.passed and "contract.scale_format" in report.passed
    assert 0 < reference_gate(weight, planes, original.float().numpy()) < 0.2  # honest 4-bit


def test_grit_view(case):
    kind, _, _, planes, inv, _ = case
    (weight,) = infer_safetensors(config(kind), inv)
    record = weight.contract.grit
    if kind == "mxfp4":
        assert record.expressible and record.grade == grit.GRADE_MXFP4
        # GRIT's own decoder of the same bytes agrees (row-major blocks of 32 along K)
        row = planes[f"{PREFIX}.weight_packed"][3].tobytes()
        scales = planes[f"{PREFIX}.weight_scale"][3].tobytes()
        values = np.array(grit.decode_mxfp4([row, scales], K), dtype=np.float32)
        assert np.array_equal(values, decode_weight(weight, planes, rows=[3])[0])
    else:
        assert not record.expressible and "divided" in record.why


def test_declared_nvfp4_multiply_law_is_grit_nvf4():
    """A per-tensor scale that multiplies (ModelOpt ``weight_scale_2``), declared, decodes as GRIT NVF4."""
    kind = "nvfp4"
    _, _, planes, inv = _case(kind)
    glob = f"{PREFIX}.weight_global_scale"
    planes = {**planes, glob: (1 / planes[glob]).astype(np.float32)}
    declare = {"weights": {WEIGHT: {"global_scale": {"law": "multiply"}, "decode_law": "mx_f32"}}}
    (weight,) = infer_safetensors(config(kind), inv, declare=declare)
    assert weight.contract.label.kind == "declared" and weight.contract.grit.grade == grit.GRADE_NVF4
    row = planes[f"{PREFIX}.weight_packed"][2].tobytes()
    values = grit.decode_nvf4([row, planes[f"{PREFIX}.weight_scale"][2].tobytes(), planes[glob].tobytes()], K)
    assert np.array_equal(np.array(values, dtype=np.float32), decode_weight(weight, planes, rows=[2])[0])


def test_declarable_without_a_producer_config():
    _, compressed, planes, inv = _case("mxfp4", seed=1)
    quant = config("mxfp4")["quantization_config"]
    (weight,) = infer_safetensors({}, inv, declare={"quantization": quant})
    assert weight.contract.label.kind == "declared" and weight.contract.family == "mx_block"
    assert np.array_equal(decode_weight(weight, planes), decompress("mxfp4", compressed))


def _swap(inv, leaf, dtype=None, shape=None):
    info = inv[f"{PREFIX}.{leaf}"]
    return {**inv, info.name: TensorInfo(info.name, dtype or info.dtype, shape or info.shape)}


@pytest.mark.parametrize(
    ("kind", "leaf", "dtype", "shape", "error"),
    [
        ("mxfp4", "weight_scale", "F16", None, ScaleNarrowingError),  # float scales declared e8m0
        ("nvfp4", "weight_scale", "BF16", None, ScaleFormatError),  # not an E4M3 plane
        ("nvfp4", "weight_scale", None, (N, K // 16 - 1), ScaleShapeError),  # a short scale plane
        ("mxfp4", "weight_scale", None, (N, 1), ScaleShapeError),  # one scale broadcast over a row
        ("mxfp4", "weight_packed", "I32", None, PlaneDtypeError),  # FP4 codes are bytes
        ("nvfp4", "weight_global_scale", "F16", None, GlobalScaleError),
        ("nvfp4", "weight_global_scale", None, (2,), GlobalScaleError),
    ],
)
def test_hostile_inventory_refused(kind, leaf, dtype, shape, error):
    _, _, _, inv = _case(kind)
    with pytest.raises(error) as raised:
        infer_safetensors(config(kind), _swap(inv, leaf, dtype, shape))
    assert WEIGHT in str(raised.value) and "expected" in str(raised.value)


def test_global_scale_missing_refused():
    _, _, _, inv = _case("nvfp4")
    del inv[f"{PREFIX}.weight_global_scale"]
    with pytest.raises(PlaneMissingError, match="weight_global_scale"):
        infer_safetensors(config("nvfp4"), inv)


def test_producer_settings_refused():
    _, _, _, inv = _case("nvfp4")
    cfg = config("nvfp4")
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    with pytest.raises(UnsupportedContractError, match="group_size 16"):
        infer_safetensors(cfg, inv)


@pytest.mark.parametrize("value", [np.nan, np.inf, 0.0, -2.0])
def test_global_scale_value_refused(value):
    _, _, planes, inv = _case("nvfp4")
    (weight,) = infer_safetensors(config("nvfp4"), inv)
    bad = {**planes, f"{PREFIX}.weight_global_scale": np.array([value], dtype=np.float32)}
    with pytest.raises(GlobalScaleError, match="positive finite"):
        run_gates(weight, bad, inv)
    with pytest.raises(GlobalScaleError):
        decode_weight(weight, bad)


def test_scale_values_refused():
    _, _, planes, inv = _case("mxfp4")
    (mx,) = infer_safetensors(config("mxfp4"), inv)
    scales = planes[f"{PREFIX}.weight_scale"].copy()
    scales[1, 2] = 0xFF  # E8M0 NaN
    with pytest.raises(ScaleValueError, match="NaN"):
        run_gates(mx, {**planes, f"{PREFIX}.weight_scale": scales}, inv)
    _, _, planes, inv = _case("nvfp4")
    (nv,) = infer_safetensors(config("nvfp4"), inv)
    scales = planes[f"{PREFIX}.weight_scale"].copy()
    scales[0, 0] |= 0x80  # a negative E4M3 block scale
    with pytest.raises(ScaleSignError):
        run_gates(nv, {**planes, f"{PREFIX}.weight_scale": scales}, inv)
    with pytest.raises(PlaneSizeError):  # a truncated codes plane
        run_gates(nv, {**planes, f"{PREFIX}.weight_packed": planes[f"{PREFIX}.weight_packed"][:-1]})


def test_declared_variants_refused():
    _, _, _, inv = _case("nvfp4")
    cases = [
        ({"scales": {"placement": "swizzle_128x4"}}, ScalePlacementError, "row_major"),
        ({"scales": {"format": "e8m0"}}, ScaleFormatError, "e4m3"),
        ({"scales": {"group_size": 32, "group_count": 4}}, ScaleShapeError, "blocks of 16"),
        ({"codes": {"encoding": "u4"}}, UnsupportedContractError, "e2m1"),
    ]
    for body, error, words in cases:
        with pytest.raises(error, match=words):
            infer_safetensors(config("nvfp4"), inv, declare={"weights": {WEIGHT: body}})
    (weight,) = infer_safetensors(config("nvfp4"), inv)
    unscaled = weight.contract.model_copy(update={"global_scale": GlobalScaleNone(kind="none")})
    with pytest.raises(GlobalScaleError, match="binary32 plane"):  # NVFP4 without its global scale
        check_contract_shape(WEIGHT, unscaled, weight.shape)
    with pytest.raises(DeclareSpecError):  # the law is a closed set
        infer_safetensors(config("nvfp4"), inv, declare={"weights": {WEIGHT: {"decode_law": "affine_f32"}}})
    with pytest.raises((DeclareSpecError, ContractSchemaError)):  # FP4 is not an integer encoding
        infer_safetensors(config("nvfp4"), inv, declare={"weights": {WEIGHT: {"family": "affine_int"}}})


def test_partial_block_refused():
    original = torch.randn(4, 48, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    padded = torch.nn.functional.pad(original, (0, 16))
    compressed = compress("mxfp4", padded)
    inv = inventory(PREFIX, compressed)
    info = inv[f"{PREFIX}.weight_packed"]
    inv[info.name] = TensorInfo(info.name, "U8", (4, 24))  # K = 48: one and a half blocks
    with pytest.raises((TailGroupError, ScaleShapeError)):
        infer_safetensors(config("mxfp4"), inv)


def test_permuted_mx_columns_decode_in_logical_order():
    _, compressed, planes, inv = _case("mxfp4")
    reference = decompress("mxfp4", compressed)
    order = np.random.default_rng(4).permutation(K).astype(np.int32)
    perm = f"{PREFIX}.perm"
    body = {
        "permutation": {
            "kind": "plane",
            "plane": perm,
            "physical_dtype": "I32",
            "physical_shape": [K],
            "axis": "K",
            "direction": "stored_to_logical",
        }
    }
    (weight,) = infer_safetensors(config("mxfp4"), inv)
    contract = apply_weight_declarations(WEIGHT, weight.contract, parse_declare({"weights": {WEIGHT: body}}))
    permuted = LogicalWeight(
        name=WEIGHT,
        shape=weight.shape,
        planes=(*weight.planes, PlaneRef(role="perm", tensor=perm, dtype="I32", shape=(K,))),
        contract=contract,
        binding=weight.binding,
        witness=None,
    )
    with_perm = {**planes, perm: order}
    decoded = decode_weight(permuted, with_perm)
    assert np.array_equal(decoded[:, order], reference)  # stored column s is logical column order[s]
    run_gates(permuted, with_perm)
    order[1] = order[0]
    with pytest.raises(PermutationError, match="repeated"):
        run_gates(permuted, with_perm)
    order[1] = K  # one past the last column
    with pytest.raises(PermutationError, match="outside"):
        decode_weight(permuted, with_perm)


def test_transposed_scale_plane_declared_by_its_axes():
    """A G-major scale plane is row_major over physical_axes (G, N), declared; it decodes the same."""
    _, compressed, planes, inv = _case("mxfp4", seed=2)
    name = f"{PREFIX}.weight_scale"
    groups = K // 32
    planes = {**planes, name: np.ascontiguousarray(planes[name].T)}
    inv = {**inv, name: TensorInfo(name, "U8", (groups, N))}
    with pytest.raises(ScaleShapeError):  # undeclared, the [G, N] plane is not [N, G]
        infer_safetensors(config("mxfp4"), inv)
    declare = {"weights": {WEIGHT: {"scales": {"physical_axes": ["G", "N"]}}}}
    (weight,) = infer_safetensors(config("mxfp4"), inv, declare=declare)
    run_gates(weight, planes, inv)
    assert np.array_equal(decode_weight(weight, planes), decompress("mxfp4", compressed))
    assert not weight.contract.grit.expressible and "transposed" in weight.contract.grit.why


def test_every_scale_and_code_decodes_as_compressed_tensors():
    """Every E8M0 exponent 0..254 and every E4M3 scale (not NaN), with every code, bit for bit."""
    codes = np.arange(16, dtype=np.uint8)[None, :] * 17  # bytes 0x00, 0x11, ... 0xFF: all 16 codes twice
    exponents = np.arange(255, dtype=np.uint8)[:, None]
    mx = {
        "weight_packed": torch.from_numpy(np.repeat(codes, 255, 0) ^ (exponents & 0x0F)),
        "weight_scale": torch.from_numpy(exponents.copy()),
    }
    e4m3 = np.arange(0x7F, dtype=np.uint8)[:, None]  # every positive non-NaN E4M3
    rows = np.random.default_rng(0).integers(0, 256, size=(len(e4m3), 16), dtype=np.uint8)
    cases = [("mxfp4", mx)] + [
        (
            "nvfp4",
            {
                "weight_packed": torch.from_numpy(rows),
                "weight_scale": torch.from_numpy(np.repeat(e4m3, 2, 1)).view(torch.float8_e4m3fn),
                "weight_global_scale": torch.tensor([g], dtype=torch.float32),
            },
        )
        for g in (1.0, 3.0, 448 * 6 / 2.7, 7.7e4)
    ]
    for kind, compressed in cases:
        (weight,) = infer_safetensors(config(kind), inventory(PREFIX, compressed))
        decoded = decode_weight(weight, numpy_planes(PREFIX, compressed))
        reference = decompress(kind, compressed)
        assert np.array_equal(decoded.view(np.uint32), reference.view(np.uint32)), kind
