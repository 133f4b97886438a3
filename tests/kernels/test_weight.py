"""The rank-local weight builder: what it checks, and that the local contract decodes the slice itself."""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest

from shardport.kernels import rank_weight
from shardport.kernels.errors import RankWeightError
from shardport.registry.contracts import TensorInfo, decode_weight, infer_gguf


@pytest.fixture(scope="module")
def gptq():
    return kc.gptq(96, 256, 32)


@pytest.fixture(scope="module")
def q4_1():
    return kc.gguf("Q4_1", 96, 256)


@pytest.mark.parametrize("name", ["gptq", "q4_1"])
@pytest.mark.parametrize("bounds", [{"N": (32, 80), "K": (0, 256)}, {"N": (0, 96), "K": (64, 192)}])
def test_local_decode_equals_the_slice_of_the_full_decode(request, name, bounds):
    case = request.getfixturevalue(name)
    weight = rank_weight(case.weight, kc.slice_planes(case, bounds), bounds)
    full = decode_weight(case.weight, case.planes)
    local = decode_weight(weight.local_weight, weight.named_planes)
    assert np.array_equal(local, full[slice(*bounds["N"]), slice(*bounds["K"])])
    assert (weight.n_local, weight.k_local, weight.row_start, weight.col_start) == (
        bounds["N"][1] - bounds["N"][0],
        bounds["K"][1] - bounds["K"][0],
        bounds["N"][0],
        bounds["K"][0],
    )
    assert weight.plane_bytes == sum(a.nbytes for a in kc.slice_planes(case, bounds).values())


def test_missing_plane_and_bad_bounds(gptq):
    planes = {k: v for k, v in gptq.planes.items() if not k.endswith("qzeros")}
    with pytest.raises(RankWeightError, match="missing"):
        rank_weight(gptq.weight, planes)
    with pytest.raises(RankWeightError, match="slice bounds"):
        rank_weight(gptq.weight, gptq.planes, {"N": (0, 97)})


def test_gguf_slice_inside_a_block_and_wrong_plane(q4_1):
    with pytest.raises(RankWeightError, match="whole Q4_1 blocks"):
        rank_weight(q4_1.weight, q4_1.planes, {"K": (16, 256)})
    tensor = q4_1.weight.contract.plane
    with pytest.raises(RankWeightError, match="uint8 blocks"):
        rank_weight(q4_1.weight, {tensor: q4_1.planes[tensor][:, :-20]})


def test_sequential_g_idx_of_a_k_slice_must_be_the_columns_groups(gptq):
    bounds = {"N": (0, 96), "K": (64, 192)}
    planes = kc.slice_planes(gptq, bounds)
    g_idx = f"{kc.PREFIX}.g_idx"
    planes[g_idx] = planes[g_idx] - 2  # local numbering: not what the manifest's sequential map says
    with pytest.raises(RankWeightError, match="sequential"):
        rank_weight(gptq.weight, planes, bounds)


@pytest.mark.parametrize(("ggml_type", "dtype"), [("F32", np.float32), ("F16", np.float16)])
def test_a_gguf_float_tensor_comes_as_the_loader_views_it(ggml_type, dtype):
    """A 2-D F32/F16 GGUF tensor (a MoE router ``ffn_gate_inp``, an F16 head) is a float array, not bytes."""
    tensor = "blk.0.ffn_gate_inp.weight"
    infos = [TensorInfo(tensor, ggml_type, (4, 64))]
    weight = next(w for w in infer_gguf({"general.architecture": "llama"}, infos) if w.name == tensor)
    values = np.random.default_rng(1).standard_normal((4, 64)).astype(dtype)
    local = rank_weight(weight, {tensor: values[1:3]}, {"N": (1, 3)})
    decoded = decode_weight(local.local_weight, local.named_planes)
    assert np.array_equal(decoded, values[1:3].astype(np.float32))
    with pytest.raises(RankWeightError, match=f"uint8 blocks \\[2, {64 * np.dtype(dtype).itemsize}\\]"):
        rank_weight(weight, {tensor: values[1:3, :32]}, {"N": (1, 3)})
