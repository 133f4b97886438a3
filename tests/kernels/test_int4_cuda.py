"""The CUDA int4 (tinygemm) kernel, the parts a CPU can check: admission, the packing, lazy import.

What needs a GPU (the repack on the device, the matmul, parity L1-L3 through the kernel) is in
``bench/cuda_kernels.py``, run on a CUDA machine; nothing here is skipped.
"""

from __future__ import annotations

import subprocess
import sys

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import Device, admit, cuda_device, default_catalog, operator_signature, rank_weight
from shardport.kernels.admission import Reason
from shardport.kernels.errors import KernelInputError
from shardport.kernels.int4_cpu import int4_terms
from shardport.kernels.int4_cuda import (
    CAPABILITY as TINY,
)
from shardport.kernels.int4_cuda import (
    _torch_call,
    inner_k_tiles,
    layout_error,
    layout_rows,
    pack_tinygemm_u8,
    round_bf16,
    scale_zero_bf16,
    tinygemm_budget,
    unpack_tinygemm_u8,
)

H100 = Device(kind="cuda", cc=(9, 0))
A100 = Device(kind="cuda", cc=(8, 0))
N, K = 64, 256


def _op(case, *, n=None, k=None, dtype="bfloat16", device=H100, bounds=None):
    planes = kc.slice_planes(case, bounds) if bounds else case.planes
    return operator_signature(rank_weight(case.weight, planes, bounds), dtype, "decode", device)


@pytest.fixture(scope="module")
def cases():
    return {
        "gptq": kc.gptq(N, K, 32),
        "gptq_g128": kc.gptq(N, K, 128),
        "gptq_g16": kc.gptq(N, K, 16),
        "gptq_tail": kc.gptq(N, 336, 32),
        "q4_0_n12": kc.gguf("Q4_0", 12, K),
        "awq": kc.awq(N, K, 32),
        "ct_sym": kc.compressed_tensors(N, K, 32),
        "ct_asym": kc.compressed_tensors(N, K, 32, symmetric=False),
        "q4_0": kc.gguf("Q4_0", N, K),
        "q4_1": kc.gguf("Q4_1", N, K),
        "q8_0": kc.gguf("Q8_0", N, K),
    }


# representation -> reasons cuda.int4-tinygemm refuses it for on an sm90 device (empty: accepted)
EXPECTED = {
    "gptq": (),
    "gptq_g128": (),
    "gptq_g16": (Reason.GROUP_SIZE,),
    "gptq_tail": (Reason.TAIL_GROUP, Reason.K_MULTIPLE),
    "q4_0_n12": (Reason.N_MULTIPLE,),
    "awq": (),
    "ct_sym": (),
    "ct_asym": (),
    "q4_0": (),
    "q4_1": (),
    "q8_0": (Reason.LAYOUT,),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_admission_table_on_a_cuda_device(cases, name):
    verdict = admit(_op(cases[name]), TINY)
    assert verdict.reasons == EXPECTED[name], str(verdict)
    assert verdict.accepted == (not EXPECTED[name])


def test_refused_on_the_cpu_with_the_device_reason(cases):
    verdict = admit(_op(cases["gptq"], device=Device(kind="cpu", isa="AVX512")), TINY)
    assert verdict.reasons == (Reason.DEVICE,)
    assert "expected one of ['cuda'], found cpu/AVX512" in str(verdict)


def test_refused_below_sm80_and_accepted_from_it(cases):
    old = admit(_op(cases["gptq"], device=Device(kind="cuda", cc=(7, 5))), TINY)
    assert old.reasons == (Reason.CUDA_CC,) and "(7, 5)" in str(old)
    assert admit(_op(cases["gptq"], device=A100), TINY).accepted
    assert admit(_op(cases["gptq"], device=Device(kind="cuda")), TINY).reasons == (Reason.CUDA_CC,)


@pytest.mark.parametrize(("dtype", "accepted"), [("bfloat16", True), ("float16", False), ("float32", False)])
def test_only_bfloat16_activations(cases, dtype, accepted):
    verdict = admit(_op(cases["awq"], dtype=dtype), TINY)
    assert verdict.accepted == accepted
    assert accepted or verdict.reasons == (Reason.ACTIVATION_DTYPE,)


def test_rank_slices_keep_the_multiples(cases):
    gptq = cases["gptq"]
    # tp=3 along K at whole groups of 32: 96 / 64 / 96 columns, each a multiple of 32 -> accepted
    for k0, k1 in kc.splits(K, 3, 32):
        assert admit(_op(gptq, bounds={"N": (0, N), "K": (k0, k1)}), TINY).accepted
    # an N slice of 60 rows is not a multiple of the 8-row tile
    verdict = admit(_op(gptq, bounds={"N": (0, 60), "K": (0, K)}), TINY)
    assert verdict.reasons == (Reason.N_MULTIPLE,)


def test_default_catalog_lists_it_and_dispatch_on_the_cpu_refuses_it(cases):
    from shardport.kernels import dispatch

    assert "cuda.int4-tinygemm" in [k.capability.id for k in default_catalog()]
    weight = rank_weight(cases["gptq"].weight, cases["gptq"].planes)
    _, trace = dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode")
    (cuda,) = [c for c in trace.candidates if c.kernel == "cuda.int4-tinygemm@1"]
    assert cuda.admission.reasons == (Reason.DEVICE,) and not cuda.prepared
    assert trace.selected == "cpu.int4pack@1"
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize(("k", "tiles"), [(4096, 8), (128, 8), (192, 4), (64, 4), (96, 2), (32, 2)])
def test_inner_k_tiles(k, tiles):
    assert inner_k_tiles(k) == tiles
    assert k % (tiles * 16) == 0


def test_inner_k_tiles_refuses_k_off_the_tile():
    with pytest.raises(KernelInputError, match="multiple of 32"):
        inner_k_tiles(48)


def test_packing_puts_the_even_column_in_the_high_nibble():
    u = np.array([[1, 2, 3, 4], [15, 0, 8, 7]])
    packed = pack_tinygemm_u8(u)
    assert packed.dtype == np.uint8 and packed.shape == (2, 2)
    assert packed.tolist() == [[0x12, 0x34], [0xF0, 0x87]]
    assert unpack_tinygemm_u8(packed).tolist() == u.tolist()


@pytest.mark.parametrize("name", ["gptq", "awq", "ct_sym", "ct_asym", "q4_0", "q4_1"])
def test_packing_round_trips_every_representation(cases, name):
    weight = rank_weight(cases[name].weight, cases[name].planes)
    u = int4_terms(weight).u
    packed = pack_tinygemm_u8(u)
    assert packed.shape == (N, K // 2)
    assert np.array_equal(unpack_tinygemm_u8(packed), u)
    # the fast unpacking feeding the packer agrees with the registry's generic one (the oracle)
    assert np.array_equal(int4_terms(weight, fast=False).u, u)


def test_packing_refuses_out_of_range_codes_and_odd_k():
    with pytest.raises(KernelInputError, match=r"0\.\.15"):
        pack_tinygemm_u8(np.array([[16, 0]]))
    with pytest.raises(KernelInputError, match=r"0\.\.15"):
        pack_tinygemm_u8(np.array([[-1, 0]]))
    with pytest.raises(KernelInputError, match="K even"):
        pack_tinygemm_u8(np.zeros((2, 3), dtype=np.int64))


def test_round_bf16_matches_torch_on_float32_values():
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(4096) * 10.0 ** rng.integers(-6, 6, 4096)).astype(np.float32)
    ours = round_bf16(values.astype(np.float64))
    theirs = torch.from_numpy(values).to(torch.bfloat16).double().numpy()
    assert np.array_equal(ours, theirs)
    assert round_bf16(np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 0.0])).tolist() == [1.0, 1.0 + 2**-6, 0.0]


@pytest.mark.parametrize("name", ["gptq", "awq", "q4_0", "q4_1"])
def test_layout_decode_against_the_reference_is_a_measured_conversion(cases, name):
    """The kernel's weight is bf16(``(u - 8)·s + z``); its distance from the reference is recorded."""
    weight = rank_weight(cases[name].weight, cases[name].planes)
    form = int4_terms(weight)
    sz, exact = scale_zero_bf16(form)
    assert sz.shape == (K // form.group, N, 2)
    error = layout_error(form, sz, N)
    reference = form.reference_rows(0, N)
    mine = layout_rows(form.u, sz, form.group, 0)
    assert error == float(np.abs(mine.astype(np.float64) - reference).max())
    # fp16 scales do not all fit bfloat16: a conversion, bounded by bfloat16's half-ulp of |w| (+ the
    # scale rounding times |u - 8| <= 8)
    assert not exact and error > 0
    bound = np.abs(reference).max() * 2.0**-8 + 9 * np.abs(form.scale).max() * 2.0**-8
    assert error <= bound


@pytest.mark.parametrize("name", ["gptq", "awq", "ct_asym", "q4_0", "q4_1"])
def test_the_device_weight_is_within_its_conversion_budget_and_a_mis_scale_is_not(cases, name):
    """The budget parity L2 holds tinygemm's layout to (from the planes' terms, not the measured error),
    checked on the host's exact emulation of the device weight: inside; scaled by 1.01, outside."""
    weight = rank_weight(cases[name].weight, cases[name].planes)
    form = int4_terms(weight)
    sz, _ = scale_zero_bf16(form)
    reference = form.reference_rows(0, N)
    budget = tinygemm_budget(weight, reference)
    assert "bfloat16" in budget.source and "not the measured error" in budget.source
    diff = np.abs(layout_rows(form.u, sz, form.group, 0).astype(np.float64) - reference)
    assert diff.max() > 0 and np.all(diff <= budget.bound)
    off = np.abs(layout_rows(form.u, sz * np.float32(1.01), form.group, 0).astype(np.float64) - reference)
    assert np.any(off > budget.bound)


def test_layout_is_exact_where_everything_fits_bfloat16(cases):
    weight = rank_weight(cases["gptq"].weight, cases["gptq"].planes)
    form = int4_terms(weight)
    scale = np.full_like(form.scale, 0.25)
    zero = np.full_like(form.zero, -1.0)
    tidy = type(form)(form.u, scale, zero, form.group, form.reference_rows)
    sz, exact = scale_zero_bf16(tidy)
    assert exact
    rows = layout_rows(form.u, sz, form.group, 0)
    assert np.array_equal(rows, (form.u - 8) * 0.25 - 1.0)


def test_importing_the_module_initialises_no_cuda_and_imports_no_torch():
    code = (
        "import sys\n"
        "import shardport.kernels.int4_cuda as m\n"
        "assert 'torch' not in sys.modules, 'torch imported at import'\n"
        "from shardport.kernels import default_catalog\n"
        "ids = default_catalog().ids  # other kernels import torch (CPU); CUDA stays untouched\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(ids)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'cuda.int4-tinygemm'" in done.stdout


def test_a_cuda_signature_without_a_cuda_device_fails_listing_the_reason(cases):
    """Dispatch for a (synthetic) sm90 device here: the kernel is admitted, its preparation refused."""
    from shardport.kernels import NoAdmissibleKernelError, dispatch

    weight = rank_weight(cases["gptq"].weight, cases["gptq"].planes)
    here = cuda_device()
    if here is not None and here.cc >= (8, 0):  # on a GPU CI the kernel prepares for real
        _, trace = dispatch(
            weight, default_catalog(), activation_dtype="bfloat16", phase="decode", device=here
        )
        assert trace.selected == "cuda.int4-tinygemm@1"
        return
    with pytest.raises(NoAdmissibleKernelError) as caught:
        dispatch(weight, default_catalog(), activation_dtype="bfloat16", phase="decode", device=H100)
    message = str(caught.value)
    assert "cuda.int4-tinygemm@1" in message and "CUDA device" in message and "prepare" in message
    assert not torch.cuda.is_initialized()


def test_torch_errors_become_kernel_input_errors():
    def broken(*_):
        raise RuntimeError("expected w to be uint8")

    with pytest.raises(KernelInputError, match=r"_weight_int4pack_mm.*expected w to be uint8") as caught:
        _torch_call("w[N=0:8, K=0:32]", "_weight_int4pack_mm", broken, 1)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_cuda_device_detection_agrees_with_torch():
    found = cuda_device()
    if torch.cuda.is_available():  # a GPU CI: the current device with its compute capability
        assert found is not None and found.kind == "cuda" and found.cc == torch.cuda.get_device_capability()
    else:
        assert found is None
