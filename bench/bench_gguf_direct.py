"""The direct GGUF block kernel against dequantize-whole + ``torch.matmul``, time and peak extra memory.

    .venv/bin/python bench/bench_gguf_direct.py [--repeat 7] [--out bench/results/gguf-direct.json]

For Q4_0, Q8_0, Q4_K and Q6_K at N = K = 4096 and T = 1 (decode) and T = 32 (prefill), three ways
of computing ``y = x @ W.T`` (float32) from the same raw block plane (uint8 ``[N, row_bytes]``):

- ``direct``: ``gguf_block_matmul`` (tile_rows 256: a 4 MiB float32 tile decoded and multiplied in
  turn; no float copy of W);
- ``dequant_matmul``: ``gguf.quants.dequantize`` of the whole plane, then ``x @ W.T``, every call
  (what a kernel with no persistent float copy must otherwise do);
- ``matmul_only``: ``x @ W.T`` with W dequantized once beforehand (a persistent 64 MiB float32
  copy, resident for the model's life): the speed of a float matmul, at 4-8x the memory of the bytes.

Each (type, method) runs in its own process: the plane is loaded from a file, torch warmed, then the
peak extra resident memory of the first calls is the resident high-water mark (``VmHWM``, reset just
before them) minus the resident size before them (for ``matmul_only`` the persistent copy is
reported separately as ``resident_extra_bytes``). Times are the median and minimum of ``--repeat``
calls after one warm-up, wall clock and process CPU time (on a loaded machine wall time mostly
measures the wait for a core; CPU time is the work), with ``--threads`` torch threads (default 1:
on this shared 2-core machine two OpenMP threads under load stall at every parallel region's
barrier, 10-30x slower for any many-op torch code); the load average is recorded. Q4_0 and Q8_0
planes come from ``gguf.quants.quantize`` of standard-normal weights; Q4_K and Q6_K (which gguf
cannot quantize) from random bytes whose binary16 super-scales are set to finite values in
[1e-3, 1e-2].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")
METHODS = ("direct", "dequant_matmul", "matmul_only")
TOKENS = (1, 32)
N = K = 4096
#: Byte offsets of the binary16 super-scales of the types built from random bytes.
_HALF_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208,)}


def _plane(name: str, seed: int = 0) -> np.ndarray:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[name]
    rng = np.random.default_rng(seed)
    if name not in _HALF_FIELDS:
        return np.asarray(quantize(rng.standard_normal((N, K), dtype=np.float32), qtype)).reshape(N, -1)
    block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (N * K // block, type_size), dtype=np.uint8)
    for offset in _HALF_FIELDS[name]:
        scales = rng.uniform(1e-3, 1e-2, blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(N, -1)


def _status_bytes(field: str) -> int:
    """A ``kB`` line of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Reset the resident high-water mark (VmHWM) to the current resident size (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _child(name: str, method: str, plane_path: str, repeat: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from shardport.kernels.gguf_direct import gguf_block_matmul, workspace_bytes

    blocks = np.load(plane_path)
    qtype = GGMLQuantizationType[name]
    xs = {t: torch.randn(t, K, generator=torch.Generator().manual_seed(t)) for t in TOKENS}
    torch.randn(64, 64) @ torch.randn(64, 64)  # load the BLAS before measuring
    resident_extra = 0
    weight = None
    if method == "matmul_only":
        weight = torch.from_numpy(dequantize(blocks, qtype))
        resident_extra = weight.numel() * 4

    def call(x: torch.Tensor) -> torch.Tensor:
        if method == "direct":
            return gguf_block_matmul(x, blocks, name, K)
        if method == "dequant_matmul":
            return x @ torch.from_numpy(dequantize(blocks, qtype)).T
        assert weight is not None
        return x @ weight.T

    _reset_peak()
    before = _status_bytes("VmRSS")
    for x in xs.values():
        call(x)
    peak_extra = _status_bytes("VmHWM") - before
    rows: dict[str, Any] = {}
    for t, x in xs.items():
        times, cpu = [], []
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            call(x)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        rows[str(t)] = {
            "median_s": round(statistics.median(times), 5),
            "min_s": round(min(times), 5),
            "cpu_median_s": round(statistics.median(cpu), 5),
        }
    return {
        "times": rows,
        "peak_extra_bytes": max(0, peak_extra),
        "resident_extra_bytes": resident_extra,
        "workspace_bytes_declared": workspace_bytes(name, K, 256) if method == "direct" else None,
        "plane_bytes": int(blocks.nbytes),
    }


def _summary(per_method: dict[str, Any]) -> dict[str, Any]:
    """Speed-ups of ``direct`` (other method's median time over direct's) and the peak memory ratio."""

    def median(method: str, t: str, key: str) -> float:
        return float(per_method[method]["times"][t][key])

    speedup = {
        t: {
            f"{other}_over_direct{suffix}": round(median(other, t, key) / median("direct", t, key), 2)
            for other in ("dequant_matmul", "matmul_only")
            for key, suffix in (("median_s", ""), ("cpu_median_s", "_cpu"))
        }
        for t in map(str, TOKENS)
    }
    peaks = [per_method[m]["peak_extra_bytes"] for m in ("dequant_matmul", "direct")]
    return {
        "speedup": speedup,
        "peak_memory_ratio_dequant_over_direct": round(peaks[0] / max(1, peaks[1]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each child")
    parser.add_argument("--out", default="bench/results/gguf-direct.json")
    parser.add_argument("--child", nargs=3, metavar=("TYPE", "METHOD", "PLANE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child, args.repeat, args.threads)))
        return
    import torch

    results: dict[str, Any] = {
        "n": N,
        "k": K,
        "tokens": list(TOKENS),
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": args.threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average_1min_start": round(os.getloadavg()[0], 2),
        "note": "wall time on a shared 2-core machine; peak_extra_bytes is VmHWM above the resident "
        "size before the first calls (the block plane and x excluded); matmul_only also holds "
        "resident_extra_bytes (a float32 copy of W) for the model's life",
        "types": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in TYPES:
            path = Path(tmp) / f"{name}.npy"
            np.save(path, _plane(name))
            per_method: dict[str, Any] = {}
            for method in METHODS:
                cmd = [sys.executable, __file__, "--repeat", str(args.repeat), "--threads", str(args.threads)]
                cmd += ["--child", name, method, str(path)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                per_method[method] = json.loads(out.strip().splitlines()[-1])
                print(
                    name,
                    method,
                    per_method[method]["times"],
                    per_method[method]["peak_extra_bytes"] >> 20,
                    "MiB",
                )
            per_method.update(_summary(per_method))
            results["types"][name] = per_method
    results["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({n: r["speedup"] for n, r in results["types"].items()}, indent=1))


if __name__ == "__main__":
    main()
