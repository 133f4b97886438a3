"""Run under ATEN_CPU_CAPABILITY=<isa>: learn int4pack's byte maps, check them on torch's own packing.

Prints the ISA and ``maps=ok`` when, for every K and N % 64 tried, the learnt map is a bijection and,
for random codes over N with 0, 1 and 2 whole 64-row blocks, map-unpack(torch-pack(u)) == u and
map-pack(u) == torch-pack(u); else the first failure.
"""

from __future__ import annotations

import numpy as np
import torch

from shardport.kernels.int4_bytemap import byte_map


def check(k: int, tail: int) -> str | None:
    learnt = byte_map(k, tail)
    maps = [learnt.block] + ([learnt.tail_map] if learnt.tail_map is not None else [])
    for m in maps:
        held = np.sort(np.concatenate([m.lo, m.hi]))
        if not np.array_equal(held, np.arange(m.rows * k)):
            return f"K {k} tail {tail}: the {m.rows}-row map is not a bijection"
    rng = np.random.default_rng(k + tail)
    for blocks in (0, 1, 2):
        n = 64 * blocks + tail
        if n == 0:
            continue
        u = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(u.astype(np.int32)), 1)
        if not np.array_equal(learnt.unpack(packed.numpy()), u):
            return f"K {k} N {n}: map-unpack(torch-pack(u)) != u"
        if not np.array_equal(learnt.pack(u), packed.numpy()):
            return f"K {k} N {n}: map-pack(u) != torch-pack(u)"
        gathered = learnt.gathered()
        if not np.array_equal(gathered.pack(u), packed.numpy()) or not np.array_equal(
            gathered.unpack(packed.numpy()), u
        ):
            return f"K {k} N {n}: the gather path differs"
    return None


failures = [f for k in (64, 96, 320) for tail in (0, 16, 32, 48) if (f := check(k, tail))]
print(torch.backends.cpu.get_cpu_capability(), "maps=ok" if not failures else f"maps=FAILED:{failures[0]}")
