"""A CUDA rank's weights: CPU-only kernels are refused there, and the reference fallbacks run on the device
of the activations (never silently on the CPU). The CUDA rank is a signature here (no GPU in CI)."""

from __future__ import annotations

import kernel_cases as kc
import numpy as np
import pytest
import torch

from shardport.kernels import (
    Device,
    FallbackPolicy,
    NoAdmissibleKernelError,
    cuda_device,
    default_catalog,
    dispatch,
    rank_weight,
)
from shardport.kernels.admission import Reason

H100 = Device(kind="cuda", cc=(9, 0))


def test_a_gguf_q8_0_weight_on_a_cuda_rank_is_refused_or_admitted_per_the_policy() -> None:
    case = kc.gguf("Q8_0", 64, 64)
    weight = rank_weight(case.weight, case.planes)
    with pytest.raises(NoAdmissibleKernelError) as caught:
        dispatch(weight, default_catalog(), activation_dtype="float32", phase="decode", device=H100)
    message = str(caught.value)
    # the CPU kernels say "device", the fallbacks say "policy": every reason is listed
    for cpu_only in ("cpu.int4pack@1", "cpu.int8pack@1", "cpu.gguf-direct@1"):
        assert f"{cpu_only}: refused (device: expected one of ['cpu'], found cuda/sm90" in message
    for fallback in ("full-dequant@1", "reference@1"):
        assert f"{fallback}: refused (policy: expected a class the policy allows" in message
    if cuda_device() is not None:  # pragma: no cover - no GPU in CI
        return
    allow = FallbackPolicy.from_cli("allow")
    op, trace = dispatch(
        weight, default_catalog(), activation_dtype="float32", phase="decode", device=H100, policy=allow
    )
    # without a CUDA device the full dequant cannot place its copy there: refused at preparation, and the
    # reference (which multiplies on the activations' device) is selected
    (full,) = [c for c in trace.candidates if c.kernel == "full-dequant@1"]
    assert Reason.PREPARE in full.admission.reasons and "CUDA device" in str(full.admission)
    assert trace.selected == "reference@1" and not torch.cuda.is_initialized()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32))
    y = op(x)
    assert y.device == x.device
    assert torch.allclose(y, x @ torch.from_numpy(op.decode()).T, atol=1e-5)
