"""The fast int4pack preparation gives the same form, bytes and conversion error as the generic path.

The oracle is the registry: its generic per-field unpacking (``int4_terms(..., fast=False)``, i.e.
``affine_terms``) for the codes, scales and zeros, and its reference decoder for every element's
value. The conversion error the fast path takes over each group's 16-code table must equal the
element-wise maximum ``|W_layout - W_reference|`` over the whole slice.
"""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import rank_weight
from shardport.kernels.capability import operator_signature
from shardport.kernels.device import this_cpu
from shardport.kernels.int4_cpu import PACK_ROWS, PreparedInt4, int4_terms, pack_codes
from shardport.kernels.int4_form import code_presence
from shardport.registry.contracts import decode_weight

N = K = 384

BUILDERS = {
    "gptq": lambda: kc.gptq(N, K, 32),
    "gptq_v2": lambda: kc.gptq(N, K, 128, v2=True),
    "awq": lambda: kc.awq(N, K, 64),
    "ct_sym": lambda: kc.compressed_tensors(N, K, 32),
    "ct_asym": lambda: kc.compressed_tensors(N, K, 64, symmetric=False),
    "ct_bf16": lambda: kc.compressed_tensors(N, K, 32, dtype=torch.bfloat16),
    "q4_0": lambda: kc.gguf("Q4_0", N, K),
    "q4_1": lambda: kc.gguf("Q4_1", N, K),
}


@pytest.fixture(scope="module")
def cases():
    built = {name: build() for name, build in BUILDERS.items()}
    ct = built["ct_sym"]
    contract = ct.weight.contract
    twos = contract.model_copy(update={"codes": contract.codes.model_copy(update={"encoding": "s4_twos"})})
    built["ct_twos"] = kc.Case(
        "twos", ct.weight.model_copy(update={"contract": twos}), ct.planes, ct.float_weight
    )
    return built


def _slices(case):
    """The whole weight and the rank slices of tp 3 along N and along K (uneven, at group boundaries)."""
    contract = case.weight.contract
    group = getattr(getattr(contract, "scales", None), "group_size", 32)
    return [
        {"N": (0, N), "K": (0, K)},
        *kc.rank_bounds(case, 3, "column", 16),
        *kc.rank_bounds(case, 3, "row", group),
    ]


def _elementwise_error(prepared, weight):
    """The previous definition: every element of the layout's decode against the reference decoder."""
    u = int4_terms(weight, fast=False).u
    mine = prepared._decode_from(u, 0, weight.n_local).astype(np.float64)
    reference = decode_weight(weight.local_weight, weight.named_planes).astype(np.float64)
    return float(np.abs(mine - reference).max())


@pytest.mark.parametrize("name", [*sorted(BUILDERS), "ct_twos"])
def test_fast_form_equals_the_registry_unpacking_on_every_slice(cases, name):
    case = cases[name]
    for bounds in _slices(case):
        weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
        fast, oracle = int4_terms(weight), int4_terms(weight, fast=False)
        assert fast.u.dtype == np.int8 and oracle.u.dtype == np.int64
        assert np.array_equal(fast.u, oracle.u)
        assert np.array_equal(fast.scale, oracle.scale) and np.array_equal(fast.zero, oracle.zero)
        assert fast.group == oracle.group
        reference = decode_weight(weight.local_weight, weight.named_planes)
        assert np.array_equal(fast.reference_rows(0, weight.n_local), reference)
        # the code table holds, for each group, exactly the values its elements take
        n, groups = weight.n_local, weight.k_local // fast.group
        rows = np.repeat(np.arange(n), groups)
        at = np.tile(np.arange(groups), n)
        assert fast.reference_table is not None
        table = fast.reference_table(rows, at).reshape(n, groups, 16)
        u = fast.u.astype(np.int64).reshape(n, groups, fast.group)
        picked = np.take_along_axis(table, u, axis=2).reshape(n, -1)
        assert np.array_equal(picked, reference)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_conversion_error_is_the_elementwise_maximum(cases, name, dtype):
    case = cases[name]
    for bounds in _slices(case)[:2]:
        weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
        op = operator_signature(weight, dtype, "decode", this_cpu())
        prepared = PreparedInt4(weight, op, "cpu.int4pack@1")
        error = _elementwise_error(prepared, weight)
        assert prepared.conversion_error == error
        assert error == 0 or prepared.transformation == "conversion"


def test_the_error_counts_only_the_codes_a_group_holds():
    """Codes kept to 4..11: the table's extreme codes (0, 15) would give a larger, wrong error."""
    case = kc.gguf("Q4_0", 64, 256)
    data = case.planes[case.weight.contract.plane].reshape(64, 8, 18).copy()
    qs = data[:, :, 2:]
    data[:, :, 2:] = ((qs & 0x07) | 0x04) | (((qs >> 4) & 0x07) | 0x04) << 4  # both nibbles in 4..11
    planes = {case.weight.contract.plane: data.reshape(64, -1)}
    weight = rank_weight(case.weight, planes)
    op = operator_signature(weight, "bfloat16", "decode", this_cpu())
    prepared = PreparedInt4(weight, op, "cpu.int4pack@1")
    form = int4_terms(weight)
    assert int(form.u.min()) >= 4 and int(form.u.max()) <= 11
    every_code = np.abs(
        prepared._layout_table(np.repeat(np.arange(64), 8), np.tile(np.arange(8), 64)).astype(np.float64)
        - form.reference_table(np.repeat(np.arange(64), 8), np.tile(np.arange(8), 64)).astype(np.float64)
    ).max()
    assert prepared.conversion_error == _elementwise_error(prepared, weight) > 0
    assert every_code > prepared.conversion_error


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_q4_0_with_more_groups_than_header_values(dtype):
    """Over 2**16 blocks: the error is taken once per distinct header, over the codes its blocks hold."""
    case = kc.gguf("Q4_0", 272, 8192)  # 272 * 256 = 69632 blocks
    weight = rank_weight(case.weight, case.planes)
    op = operator_signature(weight, dtype, "decode", this_cpu())
    prepared = PreparedInt4(weight, op, "cpu.int4pack@1")
    assert int4_terms(weight).group_keys is not None
    assert prepared.conversion_error == _elementwise_error(prepared, weight)
    assert (prepared.conversion_error > 0) == (dtype == "bfloat16")


@pytest.mark.parametrize("n", [16, 48, 64 * 5 + 16, PACK_ROWS + 64 + 32])
def test_packing_in_row_blocks_gives_the_bytes_of_one_call(n):
    u = np.random.default_rng(n).integers(0, 16, size=(n, 128)).astype(np.int8)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(u.astype(np.int32)), 1)
    assert torch.equal(pack_codes(u), whole)


def test_code_presence_marks_the_codes_of_each_group():
    u = np.array([[0, 3, 3, 15, 7, 7, 7, 7]], dtype=np.int8)
    assert code_presence(u, 4).tolist() == [[(1 << 0) | (1 << 3) | (1 << 15), 1 << 7]]
    assert code_presence(u.astype(np.int64), 8).tolist() == [[(1 << 0) | (1 << 3) | (1 << 15) | (1 << 7)]]
