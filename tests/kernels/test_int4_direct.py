"""The direct int4 kernel (cpu.int4-direct): admission, exact decode and operator parity on rank slices,
act order, tails, the planes used as loaded (no float copy)."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import (
    Catalog,
    Device,
    admit,
    dispatch,
    ladder,
    operator_signature,
    rank_weight,
    require,
)
from shardport.kernels.admission import Reason
from shardport.kernels.errors import KernelInputError, RankWeightError
from shardport.kernels.int4_direct import CAPABILITY, Int4DirectKernel, PreparedInt4Direct
from shardport.kernels.reference import ReferenceKernel
from shardport.registry.contracts import decode_weight

CPU = Device(kind="cpu", isa="AVX512")
DIRECT = "cpu.int4-direct@1"
TOL_QUANT = 0.2
#: Tile sizes: the default, and one that cuts every weight here into many slabs with a short last one
#: (K_local and N_local are not multiples of the slab).
TILES = (None, 700)


def _act_order(case: kc.Case) -> kc.Case:
    """The same codes with a shuffled g_idx (act order): column k's group is order[k] // group."""
    c = case.weight.contract
    k = case.weight.shape.extents[1]
    order = np.random.default_rng(0).permutation(k)
    planes = dict(case.planes)
    if c.group_map.kind == "g_idx":
        plane = c.group_map.plane
        group_map = c.group_map.model_copy(update={"sequential": False})
    else:  # compressed-tensors: a weight_g_idx plane
        plane = f"{kc.PREFIX}.weight_g_idx"
        from shardport.registry.contracts.model import GroupMapIndex

        group_map = GroupMapIndex(
            kind="g_idx", plane=plane, physical_dtype="I32", physical_shape=(k,), sequential=False
        )
    planes[plane] = (order // c.scales.group_size).astype(np.int32)
    planes_refs = case.weight.planes
    if plane not in {p.tensor for p in planes_refs}:
        from shardport.registry.contracts.model import PlaneRef

        planes_refs = (*planes_refs, PlaneRef(role="g_idx", tensor=plane, dtype="I32", shape=(k,)))
    weight = case.weight.model_copy(
        update={
            "contract": c.model_copy(update={"group_map": group_map}),
            "planes": planes_refs,
            "witness": None,
        }
    )
    return kc.Case(f"{case.label}_act_order", weight, planes, case.float_weight)


def _twos(case: kc.Case) -> kc.Case:
    c = case.weight.contract
    codes = c.codes.model_copy(update={"encoding": "s4_twos"})
    weight = case.weight.model_copy(
        update={"contract": c.model_copy(update={"codes": codes}), "witness": None}
    )
    return kc.Case(f"{case.label}_twos", weight, case.planes, case.float_weight)


def _ct_tail(n: int = 48, k: int = 256, group: int = 48) -> kc.Case:
    """compressed-tensors codes with groups of 48 over K = 256 (five whole groups and a 16-column tail)."""
    case = kc.compressed_tensors(n, k, 32, seed=5)
    c = case.weight.contract
    groups = -(-k // group)
    scale_name = c.scales.plane
    scales = (np.random.default_rng(5).random((n, groups)) * 0.05 + 0.01).astype(np.float16)
    spec = c.scales.model_copy(
        update={
            "group_size": group,
            "group_count": groups,
            "physical_shape": (n, groups),
            "tail_rule": "partial_last",
        }
    )
    refs = tuple(
        p.model_copy(update={"shape": (n, groups)}) if p.tensor == scale_name else p
        for p in case.weight.planes
    )
    weight = case.weight.model_copy(
        update={"contract": c.model_copy(update={"scales": spec}), "planes": refs, "witness": None}
    )
    return kc.Case("ct_tail48", weight, {**case.planes, scale_name: scales}, case.float_weight)


BUILDERS = {
    "gptq": lambda: kc.gptq(96, 384, 32),
    "gptq_v2": lambda: kc.gptq(96, 384, 64, v2=True),
    "gptq_tail": lambda: kc.gptq(64, 576, 128),  # 4.5 groups of 128
    "gptq_g4": lambda: kc.gptq(40, 96, 4),  # groups inside a packed word: per-slab gathers
    "awq": lambda: kc.awq(96, 384, 64),
    "ct_sym": lambda: kc.compressed_tensors(96, 384, 32),
    "ct_asym": lambda: kc.compressed_tensors(72, 384, 64, symmetric=False),
    "ct_bf16": lambda: kc.compressed_tensors(64, 256, 32, dtype=torch.bfloat16),
    "ct_channel": lambda: kc.compressed_tensors(64, 256, 256, strategy="channel"),
}
WITNESSED = {"gptq", "gptq_v2", "gptq_tail", "gptq_g4", "awq", "ct_sym", "ct_asym", "ct_bf16", "ct_channel"}


@pytest.fixture(scope="module")
def cases() -> dict[str, kc.Case]:
    built = {name: build() for name, build in BUILDERS.items()}
    built["gptq_act_order"] = _act_order(built["gptq"])
    built["ct_act_order"] = _act_order(built["ct_sym"])
    built["ct_twos"] = _twos(built["ct_sym"])
    built["gptq_twos"] = _twos(built["gptq"])
    built["ct_tail48"] = _ct_tail()
    return built


def _op(case: kc.Case, bounds=None, dtype="float32", device=CPU):
    planes = kc.slice_planes(case, bounds) if bounds else case.planes
    return operator_signature(rank_weight(case.weight, planes, bounds), dtype, "decode", device)


# -- admission --------------------------------------------------------------------------------------

ADMISSION = {
    "gptq": (),
    "gptq_v2": (),
    "gptq_tail": (),
    "gptq_g4": (),
    "awq": (),
    "ct_sym": (),
    "ct_asym": (),
    "ct_bf16": (),
    "ct_channel": (),
    "gptq_act_order": (),
    "ct_tail48": (),
}


@pytest.mark.parametrize("name", sorted(ADMISSION))
def test_admission_accepts_the_int4_representations(cases, name):
    assert admit(_op(cases[name]), CAPABILITY).reasons == ADMISSION[name]


@pytest.mark.parametrize(
    ("build", "reasons"),
    [
        (lambda: kc.compressed_tensors(64, 256, 32, bits=8), (Reason.LAYOUT,)),  # 8-bit codes
        (lambda: kc.gguf("Q4_0", 64, 256), (Reason.LAYOUT,)),  # GGUF blocks: the GGUF kernels' job
    ],
    ids=["ct_int8", "gguf_q4_0"],
)
def test_admission_refuses_other_codes(build, reasons):
    assert admit(_op(build()), CAPABILITY).reasons == reasons


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"device": Device(kind="cuda", cc=(9, 0))}, Reason.DEVICE),
        ({"scale_format": "e8m0"}, Reason.SCALE_FORMAT),
        ({"scale_levels": 2}, Reason.SCALE_LEVELS),
        ({"zero_point": "float_min"}, Reason.ZERO_POINT),  # GGUF's additive minimum: not an affine law
        ({"scale_axis": "N"}, Reason.SCALE_AXIS),
        ({"activation_dtype": "float64"}, Reason.ACTIVATION_DTYPE),
    ],
)
def test_admission_refuses_with_the_reason(cases, update, reason):
    op = _op(cases["gptq"])
    refused = admit(op.model_construct(**{**dict(op), **update}), CAPABILITY)
    assert refused.reasons == (reason,), str(refused)


def test_a_k_slice_starting_inside_a_group_never_reaches_the_kernel(cases):
    case = cases["gptq_tail"]
    bounds = {"N": (0, 64), "K": (64, 576)}
    with pytest.raises(RankWeightError, match="multiple of the group size 128"):
        rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)


def test_prepare_refuses_codes_it_cannot_read_with_a_typed_error():
    case = kc.compressed_tensors(64, 256, 32, bits=8)
    weight = rank_weight(case.weight, case.planes)
    op = operator_signature(weight, "float32", "decode", CPU)
    with pytest.raises(KernelInputError, match=r"down_proj.weight\[N=0:64, K=0:256\]: codes: expected 4-bit"):
        Int4DirectKernel().prepare(weight, op)


def test_act_order_k_slices_are_refused_at_preparation(cases):
    """A K slice of an act-order weight has every group's scales: the contract check refuses it (the
    reference decoder does too), and dispatch records it as a preparation refusal."""
    case = cases["gptq_act_order"]
    bounds = {"N": (0, 96), "K": (128, 256)}
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    with pytest.raises(Exception, match="group_count"):
        Int4DirectKernel().prepare(weight, operator_signature(weight, "float32", "decode", CPU))


# -- exact decode and operator parity ------------------------------------------------------------------


def _prepared(weight, dtype, tile):
    op = operator_signature(weight, dtype, "decode", CPU)
    if tile is None:
        prepared, trace = dispatch(
            weight, Catalog([Int4DirectKernel(), ReferenceKernel()]), activation_dtype=dtype, phase="decode"
        )
        assert trace.selected == DIRECT and trace.transformation == "none"
        return prepared
    return PreparedInt4Direct(weight, op, DIRECT, tile_elements=tile)


def _ladder(case, bounds, dtype="float32", tile=None):
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    prepared = _prepared(weight, dtype, tile)
    rng = np.random.default_rng(weight.k_local)
    xs = (
        rng.standard_normal((1, weight.k_local)).astype(np.float32),
        rng.standard_normal((64, weight.k_local)).astype(np.float32),
    )
    honest = not case.label.endswith(("_twos", "_act_order", "tail48"))  # else the floats mean other codes
    float_slice = case.float_weight[slice(*bounds["N"]), slice(*bounds["K"])] if honest else None
    result = ladder(
        prepared,
        weight,
        manifest_digest="sha256:" + "2" * 64,
        verified_tiles=1,
        activations=xs,
        float_weight=float_slice,
        tol_quant=TOL_QUANT,
    )
    return prepared, weight, require(result)


SPLITS = [(1, "column"), (2, "column"), (3, "column"), (2, "row"), (3, "row")]


@pytest.mark.parametrize("tile", TILES, ids=["tile-default", "tile-700"])
@pytest.mark.parametrize("name", sorted(WITNESSED))
def test_ladder_exact_on_rank_slices(cases, name, tile):
    case = cases[name]
    witnessed = 0
    for tp, split in SPLITS:
        unit = case.weight.contract.scales.group_size if split == "row" else 8
        for bounds in kc.rank_bounds(case, tp, split, unit):
            if bounds["K"][0] == bounds["K"][1]:  # per-channel: one group, no row split
                continue
            _, weight, result = _ladder(case, bounds, tile=tile)
            assert result.l2.exact and result.transformation == "none"
            # L1: the codes of the spot columns over every row, read back through the kernel's matmul
            assert result.l1.applicable and result.l1.readback == "kernel-columns"
            assert result.l1.mismatches == 0
            assert result.l1.codes_compared == weight.n_local * result.l1.columns
            assert [x.tokens for x in result.l3] == [1, 64]
            assert all(x.e_quant is not None and x.e_quant <= TOL_QUANT for x in result.l3)
            witnessed += result.l2.witness_checked
    assert witnessed > 0


@pytest.mark.parametrize("name", ["gptq_act_order", "ct_act_order", "ct_twos", "gptq_twos", "ct_tail48"])
@pytest.mark.parametrize("tile", TILES, ids=["tile-default", "tile-700"])
def test_act_order_twos_and_tails_are_exact(cases, name, tile):
    case = cases[name]
    splits = [(1, "column"), (3, "column")] + ([] if "act_order" in name else [(2, "row")])
    for tp, split in splits:
        unit = case.weight.contract.scales.group_size if split == "row" else 8
        for bounds in kc.rank_bounds(case, tp, split, unit):
            prepared, _, result = _ladder(case, bounds, tile=tile)
            assert result.l2.exact
            assert result.l1.readback == "kernel-columns" and result.l1.mismatches == 0  # perm / twos / tail
            assert prepared.broadcast == ("act_order" not in name)


def test_groups_inside_a_packed_word_gather_per_slab(cases):
    weight = rank_weight(cases["gptq_g4"].weight, cases["gptq_g4"].planes)
    prepared = _prepared(weight, "float32", 700)
    assert not prepared.broadcast and len(prepared.slabs) > 1
    assert np.array_equal(prepared.decode(), decode_weight(weight.local_weight, weight.named_planes))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_activations_widen_to_float32(cases, dtype):
    case = cases["awq"]
    _, _, result = _ladder(case, {"N": (0, 96), "K": (0, 384)}, dtype=dtype)
    assert result.transformation == "none" and result.l2.exact
    assert all(x.activation_dtype == dtype for x in result.l3)


# -- the planes as loaded, no float copy ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["gptq", "awq", "ct_asym"])
def test_holds_the_code_plane_in_place_and_only_small_terms(cases, name):
    case = cases[name]
    weight = rank_weight(case.weight, case.planes)
    prepared = _prepared(weight, "float32", None)
    codes = weight.planes["codes"]
    assert prepared.codes.data_ptr() == codes.__array_interface__["data"][0]  # a view, not a copy
    assert prepared.codes.untyped_storage().nbytes() == codes.nbytes
    groups = case.weight.contract.scales.group_count
    small = prepared.resident_bytes - codes.nbytes
    n, k = weight.n_local, weight.k_local
    assert 0 < small <= 2 * groups * n * 4 + (n + k) * 8  # binary32 scales/zeros and index vectors
    assert prepared.workspace <= CAPABILITY.workspace_bytes


def _rss() -> int:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_no_persistent_float_copy_after_preparation_or_a_call():
    n = k = 2048
    case = kc.gptq(n, k, 128)
    weight = rank_weight(case.weight, case.planes)
    x = torch.randn(4, k)
    _prepared(weight, "float32", None)(x)  # warm up allocators and the BLAS
    before = _rss()
    prepared = _prepared(weight, "float32", None)
    y = prepared(x)
    grown = _rss() - before
    float_copy = n * k * 4
    assert prepared.resident_bytes - weight.planes["codes"].nbytes < 0.02 * float_copy
    assert prepared.resident_bytes <= 0.3 * n * k * 2  # group 128: vs the bf16 equivalent
    assert grown < 0.25 * float_copy, (grown, prepared.resident_bytes)
    reference = (
        x.double() @ torch.from_numpy(decode_weight(weight.local_weight, weight.named_planes)).double().T
    )
    assert torch.allclose(y.double(), reference, rtol=1e-4, atol=1e-4)


def test_release_counts_the_code_plane_as_used_and_the_qparams_as_released(cases):
    """What bring-up's release walks from a rank's operators: the codes' buffer (used in place), not the
    scale, zero or g_idx planes (their binary32 terms are the operator's own small copies)."""
    from shardport.deploy.release import reachable_spans

    case = cases["gptq"]
    weight = rank_weight(case.weight, case.planes)
    prepared = _prepared(weight, "float32", None)
    spans = reachable_spans([prepared])

    def used(array: np.ndarray) -> bool:
        start = array.__array_interface__["data"][0]
        return any(s < start + array.nbytes and start < e for s, e in spans)

    assert used(weight.planes["codes"])
    assert not any(used(weight.planes[role]) for role in ("scale", "zero", "g_idx"))


def _recontained(case: kc.Case, form: str) -> kc.Case:
    """The same GPTQ codes in another container form (msb-first slots, 16- or 8-bit containers)."""
    c = case.weight.contract
    words = case.planes[c.codes.plane]
    packing = c.codes.packing
    if form == "msb_first":  # slot i at bits 28 - 4i holds element 7 - i: the very same bytes
        update = {
            "packing": packing.model_copy(
                update={"bit_order": "msb_first", "slot_order": (7, 6, 5, 4, 3, 2, 1, 0)}
            )
        }
        plane = words
    elif form == "i16":  # each int32 word's low and high halves as two int16 lines along K
        halves = words.view(np.uint32)
        plane = np.empty((2 * words.shape[0], words.shape[1]), dtype=np.int16)
        plane[0::2] = (halves & 0xFFFF).astype(np.uint16).view(np.int16)
        plane[1::2] = (halves >> 16).astype(np.uint16).view(np.int16)
        update = {"packing": packing.model_copy(update={"container_bits": 16, "slot_order": (0, 1, 2, 3)})}
    else:  # "u8": each word's four bytes as four uint8 lines along K
        lines = words.view(np.uint8).reshape(*words.shape, 4).transpose(0, 2, 1)
        plane = np.ascontiguousarray(lines.reshape(4 * words.shape[0], words.shape[1]))
        update = {"packing": packing.model_copy(update={"container_bits": 8, "slot_order": (0, 1)})}
    dtype = {"msb_first": "I32", "i16": "I16", "u8": "U8"}[form]
    codes = c.codes.model_copy(update={**update, "physical_dtype": dtype, "physical_shape": plane.shape})
    refs = tuple(
        p.model_copy(update={"shape": plane.shape, "dtype": dtype}) if p.tensor == c.codes.plane else p
        for p in case.weight.planes
    )
    weight = case.weight.model_copy(
        update={"contract": c.model_copy(update={"codes": codes}), "planes": refs, "witness": None}
    )
    return kc.Case(f"gptq_{form}", weight, {**case.planes, c.codes.plane: plane}, case.float_weight)


@pytest.mark.parametrize("form", ["msb_first", "i16", "u8"])
@pytest.mark.parametrize("tile", TILES, ids=["tile-default", "tile-300"])
def test_other_containers_and_bit_orders_decode_the_same_weight(cases, form, tile):
    case = cases["gptq"]
    other = _recontained(case, form)
    weight = rank_weight(other.weight, other.planes)
    prepared = _prepared(weight, "float32", 300 if tile else None)
    same = decode_weight(case.weight, case.planes)  # the original int32 form
    assert np.array_equal(decode_weight(weight.local_weight, weight.named_planes), same)
    assert np.array_equal(prepared.decode(), same) and prepared.broadcast


def test_padding_fields_never_turn_a_huge_scale_into_nan(cases):
    """K = 100 in words of 8 fields: each row's last word carries 4 zero-filled padding fields, which the
    tile decodes with their row's first group terms. With a huge (finite) bfloat16 scale, (0 - 8)·s there
    overflows to -inf, and -inf times the zero activation column is NaN unless the tile is zeroed there.
    Row 0's real codes in that group are all 8 (value 0), so the weight itself stays finite."""
    case = cases["ct_bf16"]  # [64, 256], groups of 32, bfloat16 scales
    c, k = case.weight.contract, 100
    groups = -(-k // 32)
    codes, scales = c.codes.plane, c.scales.plane
    words = -(-k // 8)
    planes = dict(case.planes)
    planes[codes] = np.ascontiguousarray(case.planes[codes][:, :words])
    planes[codes][0, :4] = np.array([0x88888888], dtype=np.uint32).view(planes[codes].dtype)[0]
    bits = np.ascontiguousarray(case.planes[scales][:, :groups])
    bits[0, 0] = torch.tensor([3e38], dtype=torch.bfloat16).view(torch.uint16).item()
    planes[scales] = bits
    shapes = {codes: planes[codes].shape, scales: bits.shape}
    contract = c.model_copy(
        update={
            "codes": c.codes.model_copy(update={"physical_shape": shapes[codes]}),
            "scales": c.scales.model_copy(
                update={"group_count": groups, "physical_shape": bits.shape, "tail_rule": "partial_last"}
            ),
        }
    )
    refs = tuple(p.model_copy(update={"shape": shapes.get(p.tensor, p.shape)}) for p in case.weight.planes)
    shape = case.weight.shape.model_copy(update={"extents": (64, k)})
    weight = case.weight.model_copy(
        update={"contract": contract, "planes": refs, "shape": shape, "witness": None}
    )
    rw = rank_weight(weight, planes)
    prepared = PreparedInt4Direct(rw, operator_signature(rw, "float32", "decode", CPU), DIRECT)
    reference = decode_weight(rw.local_weight, rw.named_planes)
    assert np.isfinite(reference).all()
    x = torch.randn(3, k)
    y = prepared(x).numpy()
    assert np.isfinite(y).all()
    expected = x.double().numpy() @ reference.astype(np.float64).T
    assert np.allclose(y, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert np.array_equal(prepared.decode(), reference)
    assert prepared.pad is not None and prepared.pad.numel() == 4  # one word's tail: columns past K
