"""Every type gguf.quants dequantizes: one element-table entry, a contract, a bit-exact decode, gates.

The set is gguf's own (:func:`gguf_artifacts.dequantizable`: every ggml type its ``dequantize``
accepts), so a gguf release that adds a type fails here until the type is supported.
"""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf_artifacts import dequantizable, random_blocks, tensor_data

from shardport.registry.contracts import TensorInfo, decode_weight, infer_gguf, reference_gate, run_gates
from shardport.registry.contracts.errors import (
    ReferenceErrorTooLargeError,
    ScaleValueError,
    UnsupportedContractError,
)
from shardport.registry.contracts.gguf_iquants import KSIGNS, grid
from shardport.registry.contracts.model import GgmlType, LogicalWeight
from shardport.registry.formats.elements import ELEMENTS, GGML_BY_ID

N, K = 4, 512
TYPES = dequantizable()
GRID_TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]


def _weight(ggml_type: str, shape: tuple[int, int] = (N, K)) -> LogicalWeight:
    inventory = [TensorInfo("blk.0.ffn_down.weight", ggml_type, shape)]
    (weight,) = infer_gguf({"general.architecture": "llama"}, inventory)
    return weight


def test_the_set_is_every_type_people_ship() -> None:
    newer = {"Q2_K", "Q3_K", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "IQ4_NL", "IQ4_XS", *GRID_TYPES}
    assert newer <= set(TYPES)
    assert set(TYPES) == set(get_args(GgmlType))  # every dequantizable type has a contract, no more


@pytest.mark.parametrize("name", TYPES)
def test_one_element_entry_with_gguf_geometry(name: str) -> None:
    qtype = GGMLQuantizationType[name]
    entry = ELEMENTS[name]
    assert entry.gguf_id == int(qtype) and GGML_BY_ID[int(qtype)] is entry
    assert (entry.block, entry.block_bytes) == GGML_QUANT_SIZES[qtype]
    assert [e.name for e in ELEMENTS.values() if e.gguf_id == int(qtype)] == [name]


@pytest.mark.parametrize("name", TYPES)
def test_decode_is_bit_exact_with_gguf(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    data = tensor_data(name, (N, K), rng)
    expected = quants.dequantize(data, GGMLQuantizationType[name]).astype(np.float32).reshape(N, K)
    weight = _weight(name)
    planes = {weight.contract.plane: np.ascontiguousarray(data).view(np.uint8).reshape(N, -1)}
    if name in ("F32", "F16", "BF16"):
        planes = {weight.contract.plane: data}
    assert run_gates(weight, planes).passed[-1] == "values.block_scales"
    decoded = decode_weight(weight, planes)
    assert np.array_equal(decoded.view(np.uint32), expected.view(np.uint32))
    assert np.array_equal(
        decode_weight(weight, planes, rows=[3, 0]).view(np.uint32), expected[[3, 0]].view(np.uint32)
    )


@pytest.mark.parametrize("name", GRID_TYPES)
def test_grids_unpack_to_gguf_tables(name: str) -> None:
    source = getattr(quants, name)
    source.init_grid()
    assert np.array_equal(grid(name), np.asarray(source.grid).reshape(grid(name).shape))
    assert np.array_equal(KSIGNS, np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8))


HOSTILE_SCALES = {
    # (type, byte offset in the first block, bytes written, what the message names)
    "MXFP4 e8m0 NaN": ("MXFP4", 0, b"\xff", "e8m0"),
    "NVFP4 e4m3 NaN": ("NVFP4", 1, b"\x7f", "e4m3"),
    "NVFP4 sign bit": ("NVFP4", 3, b"\x85", "bit 7 clear"),
    "Q2_K dmin inf": ("Q2_K", 82, b"\x00\x7c", "d/dmin"),
    "Q3_K d NaN": ("Q3_K", 108, b"\x00\x7e", "d/dmin"),
    "IQ4_XS d inf": ("IQ4_XS", 0, b"\x00\xfc", "d/dmin"),
    "IQ2_XXS d NaN": ("IQ2_XXS", 0, b"\x01\x7e", "d/dmin"),
    "TQ1_0 d inf": ("TQ1_0", 52, b"\x00\x7c", "d/dmin"),
    "IQ1_M d inf": ("IQ1_M", 55, b"\x7c", "d/dmin"),  # top nibble of the last scale word: exponent bits
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SCALES))
def test_a_scale_no_quantizer_writes_is_refused(case: str) -> None:
    name, offset, patch, named = HOSTILE_SCALES[case]
    data = random_blocks(name, N, K, np.random.default_rng(5)).copy()
    if name == "IQ1_M":  # the d nibbles: 0x7C00 is inf (exponent all ones, mantissa 0)
        words = data[0, 48:56].copy().view("<u2")
        words &= 0x0FFF
        words |= np.array([0x0000, 0x0000, 0xC000, 0x7000], dtype="<u2")
        data[0, 48:56] = words.view(np.uint8)
    else:
        data[0, offset : offset + len(patch)] = np.frombuffer(patch, dtype=np.uint8)
    weight = _weight(name)
    with pytest.raises(ScaleValueError, match=named) as err:
        run_gates(weight, {weight.contract.plane: data})
    assert name in str(err.value) and "blk.0.ffn_down.weight" in str(err.value)


def test_grades_say_why_or_which() -> None:
    assert _weight("MXFP4").contract.grit.grade == "grit1(e=e2m1,k0=32,s0=e8m0,esr=exp2floormaxabs)"
    nvfp4 = _weight("NVFP4").contract.grit
    assert not nvfp4.expressible and nvfp4.why is not None and "no entry" in nvfp4.why
    iq = _weight("IQ4_XS").contract.grit
    assert not iq.expressible and iq.why is not None and "codebook" in iq.why


@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0", "MXFP4"])
def test_gguf_quantizer_output_is_within_the_honest_bound(name: str) -> None:
    rng = np.random.default_rng(11)
    reference = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
    data = quants.quantize(reference, GGMLQuantizationType[name])
    weight = _weight(name)
    planes = {weight.contract.plane: data}
    assert 0 < reference_gate(weight, planes, reference) < 1  # ternary codes of gaussian weights: ~0.8
    wrong = data.copy()
    wrong[:, -1] ^= 0x11  # the last codes of every row moved: far from the weights they stand for
    with pytest.raises(ReferenceErrorTooLargeError):
        reference_gate(weight, {weight.contract.plane: wrong}, reference)


def test_a_float_reference_for_a_grid_type_is_refused_by_name() -> None:
    data = random_blocks("IQ2_XS", N, K, np.random.default_rng(2))
    weight = _weight("IQ2_XS")
    with pytest.raises(UnsupportedContractError, match="grid"):
        reference_gate(weight, {weight.contract.plane: data}, np.zeros((N, K), np.float32))
