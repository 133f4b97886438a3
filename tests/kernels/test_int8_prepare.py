"""int8pack preparation uses the loaded bytes as the codes where they are, with the generic path's numbers.

The oracle is the registry: its generic unpacking for the codes and its reference decoder for every
element; the conversion error taken over each row's 256-code table must equal the element-wise one.
"""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import rank_weight
from shardport.kernels.capability import operator_signature
from shardport.kernels.device import this_cpu
from shardport.kernels.int8_kernel import PreparedInt8
from shardport.registry.contracts import decode_weight
from shardport.registry.contracts.decode import affine_terms
from shardport.registry.contracts.formats import round_to_format
from shardport.registry.contracts.model import LogicalShape, Packing

N = K = 192


def _ct8(dtype: torch.dtype) -> kc.Case:
    return kc.compressed_tensors(N, K, K, bits=8, strategy="channel", dtype=dtype)


def _registry_codes(weight) -> np.ndarray:
    shape = LogicalShape(axes=("N", "K"), extents=(weight.n_local, weight.k_local))
    return affine_terms(weight.contract, weight.named_planes, shape, None, weight.where).q


def _unpacked(case: kc.Case, container: str) -> kc.Case:
    """The same codes one per container (``I8`` or ``I32``), plain two's complement."""
    weight = rank_weight(case.weight, case.planes)
    q = np.ascontiguousarray(_registry_codes(weight), dtype=np.int8 if container == "I8" else np.int32)
    c = case.weight.contract
    plain = Packing(
        axis="none", container_bits=8, scheme="slots", slot_order=(0,), bit_order="lsb_first", tail="exact"
    )
    codes = c.codes.model_copy(
        update={"packing": plain, "physical_dtype": container, "physical_shape": (N, K), "encoding": "s8"}
    )
    planes = {**case.planes, c.codes.plane: q}
    contract = c.model_copy(update={"codes": codes})
    return kc.Case(
        container,
        case.weight.model_copy(update={"contract": contract, "witness": None}),
        planes,
        case.float_weight,
    )


@pytest.mark.parametrize("layout", ["packed", "I8", "I32"])
@pytest.mark.parametrize("scale", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_codes_scales_and_error_equal_the_elementwise_definition(layout, scale, dtype):
    case = _ct8(scale)
    case = case if layout == "packed" else _unpacked(case, layout)
    for bounds in [{"N": (0, N), "K": (0, K)}, kc.rank_bounds(case, 3, "column", 16)[1]]:
        planes = {k: (v[slice(*bounds["N"])] if v.ndim == 2 else v) for k, v in case.planes.items()}
        weight = rank_weight(case.weight, planes, bounds)
        prepared = PreparedInt8(
            weight, operator_signature(weight, dtype, "decode", this_cpu()), "cpu.int8pack@1"
        )
        assert prepared.codes.dtype == torch.int8 and prepared.codes.is_contiguous()
        assert np.array_equal(prepared.codes.numpy(), _registry_codes(weight))
        reference = decode_weight(weight.local_weight, weight.named_planes)
        error = float(np.abs(prepared.decode() - reference).max())
        assert prepared.conversion_error == error
        assert prepared.transformation == ("conversion" if error else "repack")


def test_an_int8_plane_is_used_as_loaded():
    case = _unpacked(_ct8(torch.float16), "I8")
    weight = rank_weight(case.weight, case.planes)
    prepared = PreparedInt8(
        weight, operator_signature(weight, "float32", "decode", this_cpu()), "cpu.int8pack@1"
    )
    assert np.shares_memory(prepared.codes.numpy(), case.planes[case.weight.contract.codes.plane])


def test_the_error_counts_only_the_codes_a_row_holds():
    """Codes kept to -8..7: the table's other codes (up to ±128) would give a larger, wrong error."""
    case = _unpacked(_ct8(torch.float16), "I8")
    plane = case.weight.contract.codes.plane
    case.planes[plane] = np.clip(case.planes[plane], -8, 7).astype(np.int8)
    weight = rank_weight(case.weight, case.planes)
    prepared = PreparedInt8(
        weight, operator_signature(weight, "bfloat16", "decode", this_cpu()), "cpu.int8pack@1"
    )
    reference = decode_weight(weight.local_weight, weight.named_planes)
    held = float(np.abs(prepared.decode() - reference).max())
    shape = LogicalShape(axes=("N", "K"), extents=(N, K))
    scale = affine_terms(weight.contract, weight.named_planes, shape, None, weight.where).scale[:, :1]
    every = np.arange(-128, 128, dtype=np.float32)
    law = round_to_format(every * scale, weight.contract.scales.format)
    unrestricted = float(np.abs(every * prepared.scales.float().numpy()[:, None] - law).max())
    assert prepared.conversion_error == held > 0
    assert unrestricted > held
