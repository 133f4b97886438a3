"""Run under ATEN_CPU_CAPABILITY=<isa>: pack seeded codes, print the ISA, the bytes' digest and L1."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from shardport.kernels.capability import OperatorSignature  # noqa: F401  (the package imports cleanly)
from shardport.kernels.int4_cpu import CAPABILITY

codes = np.random.default_rng(0).integers(0, 16, size=(64, 128)).astype(np.int32)
packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1)
ones = torch.zeros(128 // 32, 64, 2)
ones[..., 0] = 1.0
back = (
    torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(128), packed, 32, ones).T.round().to(torch.int32) + 8
)
isa = torch.backends.cpu.get_cpu_capability()
ok = "L1=ok" if np.array_equal(back.numpy(), codes) and CAPABILITY.id else "L1=FAILED"
print(isa, hashlib.sha256(packed.numpy().tobytes()).hexdigest()[:16], ok)
