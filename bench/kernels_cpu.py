"""Benchmark the CPU packed int4 kernel against dequantize + ``torch.matmul``, and its load-time repack.

One GPTQ int4 weight ``N = K = 4096`` (group 128, seeded random codes, fp16 scales) is prepared with
:func:`shardport.kernels.dispatch` (the load-time repack into ``_weight_int4pack_mm_for_cpu``'s layout,
including the admission checks and the exact decode comparison) and then timed, median of ``--repeat``
calls after a warm-up, at T = 1 (decode) and T = 32 (prefill) in float32 and bfloat16, against:

* ``dequant+matmul``: at each call, dequantize the codes (already unpacked to one byte each — the most
  favourable start for the baseline) into the activation dtype and ``torch.matmul`` — what a runtime
  without a packed kernel does while keeping only the quantized weight resident;
* ``dense matmul``: ``torch.matmul`` on a weight dequantized once (a full-size float copy resident; shown
  for the memory/time trade, not the goal's baseline);
* ``int4_direct_ms``: ``cpu.int4-direct`` (:mod:`shardport.kernels.int4_direct`) on the same planes as
  loaded, decoding a tile at a time inside the matmul (float32 compute; the activation dtype widened).
  The ``int4_direct`` section times it on GPTQ, AWQ and compressed-tensors int4 weights of the same
  shape in float32, next to ``_weight_int4pack_mm_for_cpu`` in float32 and bfloat16.

Repack throughput is GB of codes (N·K/2 bytes for 4-bit, N·K for 8-bit) per second, median of
``--repeat`` preparations after a warm-up, one torch thread (a rank's share): the bare
``_convert_weight_to_int4pack`` call on ready int32 codes ``[N, K]`` (torch's converter is a scalar
loop over every code and takes int32 only); :func:`~shardport.kernels.int4_cpu.pack_codes` (int8 codes
widened and converted ``PACK_ROWS`` rows at a time); the learnt byte map's packing of the same int8
codes (:mod:`shardport.kernels.int4_bytemap`, what a preparation packs with now); and the whole
preparation (``PreparedInt4`` / ``PreparedInt8``: unpack, checks, pack, scale/zero, conversion error)
for GPTQ (this weight), GGUF Q4_0 and compressed-tensors int8 (per-channel) weights of the same shape,
in float32 and bfloat16. Compared with BLAKE3 over the same bytes (the verify half of a verified read)
and with the rank's verified read throughput recorded in ``bench/results/rank-pull.json``.

Usage: python bench/kernels_cpu.py [--size 4096] [--group 128] [--repeat 9] [--threads T]
[--parts repack,matmul,direct] (a subset of parts updates only those sections of the results file;
``--threads``: torch threads for the timings, default torch's own)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from quantized import inventory, pack_along_columns, pack_along_rows

from shardport.kernels import default_catalog, dispatch, rank_weight
from shardport.kernels.capability import operator_signature
from shardport.kernels.device import this_cpu
from shardport.kernels.int4_cpu import PreparedInt4, pack_codes
from shardport.kernels.int4_direct import PreparedInt4Direct
from shardport.kernels.int8_kernel import PreparedInt8
from shardport.registry.contracts import infer_safetensors

PREFIX = "model.layers.0.mlp.down_proj"
RESULTS = Path(__file__).parent / "results"


def _median(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _weight(n: int, k: int, group: int):
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=(k, n))
    zeros = rng.integers(1, 15, size=(k // group, n))
    scales = (rng.random((k // group, n)) * 0.02 + 0.001).astype(np.float16)
    planes = {
        f"{PREFIX}.qweight": pack_along_rows(q, 4),
        f"{PREFIX}.qzeros": pack_along_columns(zeros - 1, 4),
        f"{PREFIX}.scales": scales,
    }
    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False}
    weights = infer_safetensors({"quantization_config": config}, inventory(planes))
    weight = next(w for w in weights if w.name.startswith(PREFIX))
    return weight, planes, q.T.astype(np.uint8), zeros.T, scales.T.astype(np.float32)


def _gguf_q4_0(n: int, k: int):
    from gguf import GGMLQuantizationType, quants

    from shardport.registry.contracts import TensorInfo, infer_gguf

    w = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    tensor = "blk.0.ffn_down.weight"
    weights = infer_gguf({"general.architecture": "llama"}, [TensorInfo(tensor, "Q4_0", (n, k))])
    return rank_weight(
        next(x for x in weights if x.name == tensor), {tensor: quants.quantize(w, GGMLQuantizationType.Q4_0)}
    )


def _ct_int8(n: int, k: int):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
    import kernel_cases

    case = kernel_cases.compressed_tensors(n, k, k, bits=8, strategy="channel")
    return rank_weight(case.weight, case.planes)


def repack(rw: Any, n: int, k: int, codes: np.ndarray, planes: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Preparation throughput (GB of codes per second) against the converter alone, BLAKE3 and the read."""
    torch.set_num_threads(1)
    code_bytes = n * k // 2
    u = torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int32))  # codes is a transposed view
    pack_s = _median(lambda: torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1), repeat)
    small = np.ascontiguousarray(codes, dtype=np.int8)
    pack_rows_s = _median(lambda: pack_codes(small), repeat)
    pack_map_s = None
    try:  # the learnt byte map (absent before it existed)
        from shardport.kernels.int4_bytemap import byte_map

        learnt = byte_map(k, n % 64)  # learnt once per process, outside the timing
        pack_map_s = _median(lambda: learnt.pack(small), repeat)
    except ImportError:
        pass
    raw = planes[f"{PREFIX}.qweight"].tobytes()
    hash_s = _median(lambda: blake3.blake3(raw).digest(), repeat)
    verified = None
    pull = RESULTS / "rank-pull.json"
    if pull.exists():
        verified = statistics.median(r["read_gbps"] for r in json.loads(pull.read_text())["ranks"])
    out: dict[str, Any] = {
        "threads": 1,
        "code_bytes": code_bytes,
        "pack_only_gbps": code_bytes / pack_s / 1e9,
        "pack_rows_gbps": code_bytes / pack_rows_s / 1e9,
        "pack_byte_map_gbps": code_bytes / pack_map_s / 1e9 if pack_map_s else None,
        "blake3_gbps": code_bytes / hash_s / 1e9,
        "rank_verified_read_gbps": verified,
        "prepare": {},
    }
    weights = {
        "gptq": (rw, PreparedInt4, code_bytes),
        "gguf_q4_0": (_gguf_q4_0(n, k), PreparedInt4, code_bytes),
    }
    weights["ct_int8_channel"] = (_ct_int8(n, k), PreparedInt8, n * k)
    for label, (weight, prepared_type, nbytes) in weights.items():
        for dtype in ("float32", "bfloat16"):
            op = operator_signature(weight, dtype, "decode", this_cpu())
            seconds = _median(lambda w=weight, o=op, t=prepared_type: t(w, o, "bench"), repeat)
            prepared = prepared_type(weight, op, "bench")
            out["prepare"][f"{label}_{dtype}"] = {
                "code_bytes": nbytes,
                "seconds": seconds,
                "gbps": nbytes / seconds / 1e9,
                "transformation": prepared.transformation,
                "conversion_error": prepared.conversion_error,
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--parts", default="repack,matmul,direct")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    n = k = args.size
    weight, planes, codes, zeros, scales = _weight(n, k, args.group)
    rw = rank_weight(weight, planes)
    threads = torch.get_num_threads()
    target = RESULTS / "kernels_cpu.json"
    out: dict[str, Any] = (
        json.loads(target.read_text())
        if target.exists() and not {"repack", "matmul", "direct"} <= parts
        else {}
    )
    out.update(
        {
            "n": n,
            "k": k,
            "group": args.group,
            "threads": threads,
            "isa": str(torch.backends.cpu.get_cpu_capability()),
            "torch": torch.__version__,
        }
    )
    if "repack" in parts:
        out["repack"] = repack(rw, n, k, codes, planes, args.repeat)
        torch.set_num_threads(threads)
    prepared_bf16, _ = dispatch(rw, default_catalog(), activation_dtype="bfloat16", phase="decode")
    out["resident"] = {
        "int4_bf16_bytes": prepared_bf16.resident_bytes,
        "bf16_equivalent_bytes": n * k * 2,
        "ratio": prepared_bf16.resident_bytes / (n * k * 2),
    }
    if "direct" in parts:
        out["int4_direct"] = direct(n, k, args.group, args.repeat)
    if "matmul" not in parts:
        _write(out)
        return
    out["matmul"] = {}

    group_of = torch.arange(k) // args.group
    codes_t = torch.from_numpy(codes)
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        prepared, trace = dispatch(  # int4pack named: float32 is its slow path (measured here)
            rw, default_catalog(), activation_dtype=dtype_name, phase="decode", preferred=["cpu.int4pack"]
        )
        op = operator_signature(rw, dtype_name, "decode", this_cpu())
        direct_op = PreparedInt4Direct(rw, op, "cpu.int4-direct@1")
        s = torch.from_numpy(scales).to(dtype)
        z = torch.from_numpy(zeros).to(dtype)

        def dequant(s: torch.Tensor = s, z: torch.Tensor = z, dtype: torch.dtype = dtype) -> torch.Tensor:
            return (codes_t.to(dtype) - z[:, group_of]) * s[:, group_of]

        dense = dequant()
        for tokens in (1, 32):
            x = torch.randn(tokens, k).to(dtype)
            int4 = _median(lambda x=x, p=prepared: p(x), args.repeat)
            per_call = _median(lambda x=x: x @ dequant().T, max(3, args.repeat // 3))
            dense_mm = _median(lambda x=x, dense=dense: x @ dense.T, args.repeat)
            direct_ms = _median(lambda x=x, p=direct_op: p(x), args.repeat)
            out["matmul"][f"{dtype_name}_T{tokens}"] = {
                "transformation": trace.transformation,
                "int4_ms": int4 * 1e3,
                "dequant_matmul_ms": per_call * 1e3,
                "dense_matmul_ms": dense_mm * 1e3,
                "speedup_vs_dequant_matmul": per_call / int4,
                "speedup_vs_dense_matmul": dense_mm / int4,
                "int4_direct_ms": direct_ms * 1e3,
                "int4_direct_speedup_vs_int4": int4 / direct_ms,
                "int4_direct_speedup_vs_dequant_matmul": per_call / direct_ms,
            }
    _write(out)


def direct(n: int, k: int, group: int, repeat: int) -> dict[str, Any]:
    """``cpu.int4-direct`` (float32) vs int4pack (float32, bfloat16) on GPTQ, AWQ and compressed-tensors.

    One torch thread (a rank's share, as the repack part and bench_gguf_direct.py); the GGUF direct
    kernel on Q4_0 of the same shape is timed in the same run.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
    import kernel_cases

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _direct(kernel_cases, n, k, group, repeat)
    finally:
        torch.set_num_threads(threads)


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median wall seconds, median process CPU seconds) of ``repeat`` calls after a warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _direct(kernel_cases: Any, n: int, k: int, group: int, repeat: int) -> dict[str, Any]:
    """Each weight's kernels at T = 1 and 32: wall and CPU ms (on a loaded machine CPU time is the work)."""
    builders = {
        "gptq": lambda: kernel_cases.gptq(n, k, group),
        "awq": lambda: kernel_cases.awq(n, k, group),
        "ct": lambda: kernel_cases.compressed_tensors(n, k, group),
    }
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    for label, build in builders.items():
        case = build()
        weight = rank_weight(case.weight, case.planes)
        f32 = operator_signature(weight, "float32", "decode", this_cpu())
        bf16 = operator_signature(weight, "bfloat16", "decode", this_cpu())
        kernels = {
            "int4_direct_f32": PreparedInt4Direct(weight, f32, "cpu.int4-direct@1"),
            "int4pack_f32": PreparedInt4(weight, f32, "cpu.int4pack@1"),
            "int4pack_bf16": PreparedInt4(weight, bf16, "cpu.int4pack@1"),
        }
        row: dict[str, Any] = {"resident_bytes": kernels["int4_direct_f32"].resident_bytes}
        for tokens in (1, 32):
            x = torch.randn(tokens, k)
            for name, prepared in kernels.items():
                xt = x.to(torch.bfloat16) if name.endswith("bf16") else x
                wall, cpu = _timed(lambda p=prepared, xt=xt: p(xt), repeat)
                row[f"{name}_T{tokens}_ms"], row[f"{name}_T{tokens}_cpu_ms"] = wall * 1e3, cpu * 1e3
        out[label] = row
        del case, weight, kernels
    from shardport.kernels.gguf_direct import gguf_block_matmul

    blocks = _gguf_q4_0(n, k).planes["codes"]  # the GGUF direct kernel on Q4_0, same shape, same run
    for tokens in (1, 32):
        x = torch.randn(tokens, k)
        wall, cpu = _timed(lambda x=x: gguf_block_matmul(x, blocks, "Q4_0", k), repeat)
        row = out.setdefault("gguf_q4_0", {})
        row[f"gguf_direct_T{tokens}_ms"], row[f"gguf_direct_T{tokens}_cpu_ms"] = wall * 1e3, cpu * 1e3
    return out


def _write(out: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kernels_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
