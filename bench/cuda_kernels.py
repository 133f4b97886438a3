"""CUDA int4 kernel check and benchmark: ``cuda.int4-tinygemm`` vs the reference and vs dequant + matmul.

ONE prepared script for a CUDA machine, meant to run unattended in one shot (about 10 minutes at most):

1. builds int4 weights of every representation the kernel takes — GPTQ (g128), AWQ (g128), GGUF Q4_0 and
   Q4_1 (blocks of 32) — at ``N = K = --size`` (4096), from seeded float weights, plus small cases that
   exercise innerKTiles 2 and 4 and a tp=2 row-parallel slice (a rank-local K range starting at K/2);
2. dispatches each with :func:`shardport.kernels.dispatch` on the CUDA device (admission must select
   ``cuda.int4-tinygemm``; the trace is recorded) and runs the parity ladder L0-L3
   (:func:`shardport.kernels.ladder`: codes read back out of the packed layout through the kernel, the
   layout's decode vs the registry's reference decoder, ``E_kernel`` vs the float64 reference matmul,
   ``E_quant`` vs the float weight) at decode (T = 1) and prefill (T = 64) shapes;
3. measures throughput at T = 1, 64 and 512 in bfloat16: the int4 kernel vs dequantize (codes held one
   per byte on the GPU, the most favourable start for the baseline) + ``torch.matmul``, and vs a dense
   bfloat16 matmul on a weight dequantized once (a full-size copy resident; shown for the trade).

Results go to ``bench/results/cuda_kernels.json`` (rewritten after every case, so a timeout keeps what
was done; a run that stops before any case writes ``cuda_kernels.error.json`` instead). Every case is
caught and recorded; a global watchdog stops the run before ``--budget`` seconds and dumps the stacks
if anything hangs. Exit status: 0 all cases passed, 1 a case failed, 2 no CUDA device, 3 shardport or
a dependency cannot be imported.

``--cpu-selftest`` runs the same pipeline with the CPU int4 kernel on a small size (no GPU): it checks
the script's plumbing where no GPU is available and writes ``cuda_kernels.cpu-selftest.json``.

Usage: python bench/cuda_kernels.py [--size 4096] [--repeat 20] [--budget 540] [--cpu-selftest]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PREFIX = "model.layers.0.mlp.down_proj"
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


def _bootstrap() -> None:
    """Make ``shardport`` importable from a bare checkout (its subpackages live at the repo root)."""
    try:
        import shardport.kernels as _probe

        del _probe

        return
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT / "src"))
    import shardport

    if str(ROOT) not in shardport.__path__:
        shardport.__path__.append(str(ROOT))  # shardport.registry -> ROOT/registry, ...


def _write(out: dict[str, Any], name: str) -> None:
    """Write under bench/results/ and, where ``$OUT`` names a folder (the device runner's), there too."""
    text = json.dumps(out, indent=1, default=str) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(text)
    extra = os.environ.get("OUT")
    if extra and Path(extra).is_dir():
        (Path(extra) / name).write_text(text)


def _fail_early(out: dict[str, Any], name: str, code: int, message: str) -> None:
    out["error"] = message
    try:  # beside, never over, the results of an earlier run
        _write(out, name.replace(".json", ".error.json"))
    finally:
        print(f"ERROR: {message}", file=sys.stderr, flush=True)
        sys.exit(code)


# ---------------------------------------------------------------------------------------------- builders


def _float(n: int, k: int, seed: int) -> Any:
    import numpy as np

    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.02


def _gptq(n: int, k: int, group: int, seed: int = 0) -> tuple[Any, dict[str, Any], Any]:
    from quantized import inventory, pack_along_columns, pack_along_rows, quantize_minmax

    from shardport.registry.contracts import infer_safetensors

    w = _float(n, k, seed)
    q = quantize_minmax(w, group)
    import numpy as np

    planes = {
        f"{PREFIX}.qweight": pack_along_rows(q["q"], 4),
        f"{PREFIX}.qzeros": pack_along_columns(q["zeros"] - 1, 4),
        f"{PREFIX}.scales": q["scales"],
        f"{PREFIX}.g_idx": (np.arange(k) // group).astype(np.int32),
    }
    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False}
    weights = infer_safetensors({"quantization_config": config}, inventory(planes))
    return next(x for x in weights if x.name == f"{PREFIX}.weight"), planes, w


def _awq(n: int, k: int, group: int, seed: int = 1) -> tuple[Any, dict[str, Any], Any]:
    from quantized import AWQ_ORDER, inventory, pack_along_columns, quantize_minmax

    from shardport.registry.contracts import infer_safetensors

    w = _float(n, k, seed)
    q = quantize_minmax(w, group)
    planes = {
        f"{PREFIX}.qweight": pack_along_columns(q["q"], 4, AWQ_ORDER),
        f"{PREFIX}.qzeros": pack_along_columns(q["zeros"], 4, AWQ_ORDER),
        f"{PREFIX}.scales": q["scales"],
    }
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    weights = infer_safetensors({"quantization_config": config}, inventory(planes))
    return next(x for x in weights if x.name == f"{PREFIX}.weight"), planes, w


def _gguf(ggml_type: str, n: int, k: int, seed: int = 3) -> tuple[Any, dict[str, Any], Any]:
    """Q4_0 (``w = d·(q - 8)``) / Q4_1 (``w = d·q + m``) blocks of 32, written here from the format.

    Block: ``d`` binary16 [, ``m`` binary16], 16 bytes of nibbles: element ``j`` in the low nibble of byte
    ``j``, element ``j + 16`` in its high nibble.
    """
    import numpy as np

    from shardport.registry.contracts import TensorInfo, infer_gguf

    w = _float(n, k, seed)
    blocks = w.reshape(n, k // 32, 32)
    if ggml_type == "Q4_0":
        big = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)[..., 0]
        d = (big / -8.0).astype(np.float16)
        inv = np.where(d != 0, 1.0 / d.astype(np.float32), 0.0)
        q = np.clip(np.rint(blocks * inv[..., None]) + 8, 0, 15).astype(np.uint8)
        head = [d.view(np.uint8).reshape(n, k // 32, 2)]
    else:
        lo, hi = blocks.min(axis=2), blocks.max(axis=2)
        d = ((hi - lo) / 15.0).astype(np.float16)
        m = lo.astype(np.float16)
        inv = np.where(d != 0, 1.0 / d.astype(np.float32), 0.0)
        shifted = (blocks - m.astype(np.float32)[..., None]) * inv[..., None]
        q = np.clip(np.rint(shifted), 0, 15).astype(np.uint8)
        head = [d.view(np.uint8).reshape(n, k // 32, 2), m.view(np.uint8).reshape(n, k // 32, 2)]
    qs = q[..., :16] | (q[..., 16:] << 4)
    data = np.concatenate([*head, qs], axis=2).reshape(n, -1)
    tensor = "blk.0.ffn_down.weight"
    weights = infer_gguf({"general.architecture": "llama"}, [TensorInfo(tensor, ggml_type, (n, k))])
    return next(x for x in weights if x.name == tensor), {tensor: np.ascontiguousarray(data)}, w


def _witnessed(weight: Any, planes: dict[str, Any]) -> Any:
    from shardport.registry.contracts import make_witness

    return weight.model_copy(update={"witness": make_witness(weight, planes, seed=7)})


def _gptq_k_slice(planes: dict[str, Any], k: int, group: int, k0: int, k1: int) -> dict[str, Any]:
    """The planes of a row-parallel rank owning K = k0:k1 (whole groups and whole 8-code words)."""
    g0, g1 = k0 // group, k1 // group
    return {
        f"{PREFIX}.qweight": planes[f"{PREFIX}.qweight"][k0 // 8 : k1 // 8].copy(),
        f"{PREFIX}.qzeros": planes[f"{PREFIX}.qzeros"][g0:g1].copy(),
        f"{PREFIX}.scales": planes[f"{PREFIX}.scales"][g0:g1].copy(),
        f"{PREFIX}.g_idx": planes[f"{PREFIX}.g_idx"][k0:k1].copy(),
    }


# ---------------------------------------------------------------------------------------------- timing


class Clock:
    """Median wall time of a callable: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def median_ms(self, fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
        import torch

        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat):
            if self.cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def _throughput(
    prepared: Any, weight: Any, clock: Clock, device: Any, tokens: tuple[int, ...], repeat: int
) -> dict[str, Any]:
    import numpy as np
    import torch

    from shardport.kernels.int4_cpu import int4_terms

    form = int4_terms(weight)
    n, k = weight.n_local, weight.k_local
    dt = torch.bfloat16
    u = torch.from_numpy(form.u.astype(np.uint8)).to(device)  # [N, K], one code per byte
    scale = torch.from_numpy(form.scale.T.copy()).to(device=device, dtype=dt)  # [N, G]
    zero = torch.from_numpy(form.zero.T.copy()).to(device=device, dtype=dt)
    group_of = torch.arange(k, device=device) // form.group

    def dequant() -> Any:
        return (u.to(dt) - 8) * scale[:, group_of] + zero[:, group_of]

    dense = dequant()
    out: dict[str, Any] = {}
    op_name = "_weight_int4pack_mm" if clock.cuda else "_weight_int4pack_mm_for_cpu"
    kernel_op = getattr(torch.ops.aten, op_name)
    packed, group, sz = prepared.packed, prepared.group, prepared.scale_zero
    for t in tokens:
        x = torch.randn(t, k, device=device).to(dt)
        raw = clock.median_ms(lambda x=x: kernel_op(x, packed, group, sz), repeat)
        call = clock.median_ms(lambda x=x: prepared(x), repeat)
        per_call = clock.median_ms(lambda x=x: torch.matmul(x, dequant().T), max(3, repeat // 2))
        dense_ms = clock.median_ms(lambda x=x: torch.matmul(x, dense.T), repeat)
        flops = 2.0 * t * n * k
        out[f"T{t}"] = {
            "int4_ms": raw,
            "int4_call_ms": call,
            "dequant_matmul_ms": per_call,
            "dense_bf16_matmul_ms": dense_ms,
            "speedup_vs_dequant_matmul": per_call / raw,
            "speedup_vs_dense_bf16": dense_ms / raw,
            "int4_tflops": flops / (raw * 1e-3) / 1e12,
            "int4_weight_gbps": (n * k / 2) / (raw * 1e-3) / 1e9,
        }
        log(f"    T={t}: int4 {raw:.4f} ms, dequant+matmul {per_call:.4f} ms, dense {dense_ms:.4f} ms")
    return out


def _contract_smoke(device: Any) -> dict[str, Any]:
    """torch's contract alone, before shardport: random codes packed as the module says, every innerKTiles.

    ``w = (u - 8)·scale + zero`` with bfloat16 scale/zero; the kernel's output is compared with a float32
    matmul of that weight rounded to bfloat16 (relative Frobenius error; bf16 output ≈ 4e-3).
    """
    import numpy as np
    import torch

    from shardport.kernels.int4_cuda import pack_tinygemm_u8

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for n, k, group, tiles in ((64, 256, 32, 8), (64, 256, 128, 4), (64, 96, 32, 2), (256, 512, 256, 8)):
        key = f"N{n}_K{k}_g{group}_inner{tiles}"
        try:
            u = rng.integers(0, 16, size=(n, k))
            scale = torch.from_numpy(rng.random((k // group, n)) * 0.02 + 0.001).to(torch.bfloat16)
            zero = torch.from_numpy(rng.standard_normal((k // group, n)) * 0.01).to(torch.bfloat16)
            packed = torch.ops.aten._convert_weight_to_int4pack(
                torch.from_numpy(pack_tinygemm_u8(u)).to(device), tiles
            )
            sz = torch.stack([scale, zero], dim=-1).contiguous().to(device)
            x = torch.randn(7, k).to(torch.bfloat16)
            y = torch.ops.aten._weight_int4pack_mm(x.to(device), packed, group, sz).float().cpu()
            g = torch.arange(k) // group
            w = (torch.from_numpy(u).float() - 8) * scale.float().T[:, g] + zero.float().T[:, g]
            ref = x.float() @ w.to(torch.bfloat16).float().T
            err = float((y - ref).norm() / ref.norm())
            out[key] = {"packed_shape": list(packed.shape), "rel_error": err, "passed": err < 1e-2}
        except Exception as exc:
            out[key] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
        log(f"  contract {key}: {out[key]}")
    return out


# ---------------------------------------------------------------------------------------------- cases


def _run_case(label: str, spec: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    from shardport.kernels import default_catalog, dispatch, ladder, rank_weight

    record: dict[str, Any] = {"label": label, **{k: v for k, v in spec.items() if k != "build"}}
    t0 = time.perf_counter()
    weight, planes, w = spec["build"]()
    weight = _witnessed(weight, planes)  # over the full weight, as push records it
    bounds = spec.get("bounds")
    if bounds:
        (k0, k1) = bounds["K"]
        planes = _gptq_k_slice(planes, w.shape[1], spec["group"], k0, k1)
        w = w[:, k0:k1]
    rw = rank_weight(weight, planes, bounds)
    record["build_s"] = time.perf_counter() - t0
    if ctx["cuda"]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    prepared, trace = dispatch(
        rw, default_catalog(), activation_dtype="bfloat16", phase="decode", device=ctx["device"]
    )
    if ctx["cuda"]:
        torch.cuda.synchronize()
        # what stays allocated on the device after preparation: the ledger (packed + scale/zero) only,
        # no full-size float copy (that would be >= 2·N·K bytes)
        record["device_bytes_after_prepare"] = torch.cuda.memory_allocated() - before
    record["prepare_s"] = time.perf_counter() - t0
    record["selected"] = trace.selected
    record["transformation"] = trace.transformation
    record["conversion_error"] = trace.conversion_error
    record["refusals"] = {c.kernel: str(c.admission) for c in trace.candidates if not c.admission.accepted}
    record["resident_bytes"] = prepared.resident_bytes
    record["bf16_equivalent_bytes"] = rw.n_local * rw.k_local * 2
    if trace.selected != ctx["expect"]:
        raise RuntimeError(f"dispatch selected {trace.selected}, expected {ctx['expect']}")
    log(f"  {label}: selected {trace.selected} ({trace.transformation}, err {trace.conversion_error:.3g})")

    rng = np.random.default_rng(11)
    golden = tuple(rng.standard_normal((t, rw.k_local)).astype(np.float32) for t in spec["parity_tokens"])
    t0 = time.perf_counter()
    result = ladder(
        prepared,
        rw,
        manifest_digest="bench:cuda_kernels",
        verified_tiles=1,
        activations=golden,
        float_weight=w,
    )
    record["ladder_s"] = time.perf_counter() - t0
    record["ladder"] = result.model_dump(mode="json")
    record["ladder"]["l0"].pop("planes", None)
    record["parity_passed"] = result.passed
    levels = (
        f"L0 {result.l0.passed} L1 {result.l1.passed} ({result.l1.mismatches} mismatches) "
        f"L2 {result.l2.passed}"
    )
    l3 = ", ".join(
        f"T={x.tokens} e_kernel {x.e_kernel:.2e} (tol {x.tol_kernel + x.tol_conversion:.2e})"
        for x in result.l3
    )
    log(f"  {label}: ladder {'PASSED' if result.passed else 'FAILED'}: {levels}; {l3}")
    if spec.get("throughput") and ctx["remaining"]() > 60:
        record["throughput"] = _throughput(
            prepared, rw, ctx["clock"], ctx["torch_device"], ctx["tokens"], ctx["repeat"]
        )
    del prepared
    if ctx["cuda"]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    record["passed"] = result.passed
    if "device_bytes_after_prepare" in record:
        ledger_ok = record["device_bytes_after_prepare"] <= record["resident_bytes"] + (1 << 20)
        record["memory_within_ledger"] = ledger_ok
        record["passed"] = result.passed and ledger_ok
    return record


def _specs(size: int) -> dict[str, dict[str, Any]]:
    half = size // 2
    return {
        "gptq_g128": {
            "n": size,
            "k": size,
            "group": 128,
            "build": lambda: _gptq(size, size, 128),
            "parity_tokens": (1, 64),
            "throughput": True,
        },
        "awq_g128": {
            "n": size,
            "k": size,
            "group": 128,
            "build": lambda: _awq(size, size, 128),
            "parity_tokens": (1, 64),
            "throughput": True,
        },
        "gguf_q4_0": {
            "n": size,
            "k": size,
            "group": 32,
            "build": lambda: _gguf("Q4_0", size, size),
            "parity_tokens": (1, 64),
            "throughput": True,
        },
        "gguf_q4_1": {
            "n": size,
            "k": size,
            "group": 32,
            "build": lambda: _gguf("Q4_1", size, size),
            "parity_tokens": (1, 64),
            "throughput": True,
        },
        "gptq_tp2_rank1": {
            "n": size,
            "k": half,
            "group": 128,
            "build": lambda: _gptq(size, size, 128, 5),
            "bounds": {"N": (0, size), "K": (half, size)},
            "parity_tokens": (1, 64),
        },
        "gptq_k96_inner2": {
            "n": 64,
            "k": 96,
            "group": 32,
            "build": lambda: _gptq(64, 96, 32, seed=6),
            "parity_tokens": (1, 64),
        },
        "awq_k192_inner4": {
            "n": 64,
            "k": 192,
            "group": 64,
            "build": lambda: _awq(64, 192, 64, seed=7),
            "parity_tokens": (1, 64),
        },
    }


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", type=int, default=None, help="N = K (4096; 512 --cpu-selftest)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--budget", type=float, default=540.0, help="seconds, then skip the rest")
    parser.add_argument("--only", nargs="*", help="case labels to run (default: all)")
    parser.add_argument("--cpu-selftest", action="store_true", help="run the pipeline on the CPU int4 kernel")
    args = parser.parse_args()
    name = "cuda_kernels.cpu-selftest.json" if args.cpu_selftest else "cuda_kernels.json"
    if args.size is None:
        args.size = 512 if args.cpu_selftest else 4096
    faulthandler.enable()
    faulthandler.dump_traceback_later(args.budget + 45, exit=True)  # never hang past the limit
    out: dict[str, Any] = {
        "script": "bench/cuda_kernels.py",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "args": vars(args),
        "cases": {},
    }
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as exc:
        _fail_early(out, name, 3, f"cannot import numpy/torch: {exc}")
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        _bootstrap()
        from shardport.kernels import cuda_device, this_cpu
        from shardport.kernels.int4_cuda import CAPABILITY
    except ImportError as exc:
        _fail_early(
            out,
            name,
            3,
            f"cannot import shardport.kernels ({exc}); install its pure-Python dependencies "
            "(pydantic, numpy, gguf, ...) from the wheels shipped with the checkout, e.g. "
            "`pip install --no-index --find-links wheels/ pydantic gguf`",
        )
    if args.cpu_selftest:
        device, expect, torch_device = this_cpu(), "cpu.int4pack@1", torch.device("cpu")
    else:
        device = cuda_device()
        if device is None:
            _fail_early(
                out,
                name,
                2,
                f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees none "
                f"(torch.cuda.is_available() is {torch.cuda.is_available()}); run this on a CUDA machine",
            )
        expect, torch_device = f"{CAPABILITY.id}@{CAPABILITY.version}", torch.device("cuda")
        out["gpu"] = {
            "name": torch.cuda.get_device_name(),
            "cc": list(device.cc or ()),
            "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        }
        if device.cc is not None and device.cc < (CAPABILITY.cuda_min_cc or (0, 0)):
            out["note"] = f"sm{device.cc} is below the kernel's minimum: every case must be refused (cuda_cc)"
    out["device"] = str(device)
    out["expected_kernel"] = expect
    where = out.get("gpu", {}).get("name", str(device))
    log(f"torch {torch.__version__} on {where}; writing {RESULTS / name}")
    ctx = {
        "device": device,
        "cuda": not args.cpu_selftest,
        "expect": expect,
        "torch_device": torch_device,
        "clock": Clock(cuda=not args.cpu_selftest),
        "tokens": (1, 64, 512),
        "repeat": args.repeat,
        "remaining": lambda: args.budget - (time.monotonic() - T0),
    }
    failures = 0
    if ctx["cuda"]:
        log("contract smoke (torch alone)")
        try:
            out["contract_smoke"] = _contract_smoke(torch_device)
        except Exception as exc:
            out["contract_smoke"] = {"error": f"{type(exc).__name__}: {exc}"}
        _write(out, name)
    for label, spec in _specs(args.size).items():
        if args.only and label not in args.only:
            continue
        if ctx["remaining"]() < 30:
            out["cases"][label] = {"label": label, "skipped": "time budget spent"}
            log(f"  {label}: skipped (time budget)")
            continue
        log(f"case {label} (N={spec['n']}, K={spec['k']}, group {spec['group']})")
        try:
            out["cases"][label] = _run_case(label, spec, ctx)
            failures += not out["cases"][label]["passed"]
        except Exception as exc:  # record and go on: one broken case must not hide the others
            failures += 1
            out["cases"][label] = {
                "label": label,
                "passed": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8),
            }
            log(f"  {label}: ERROR {type(exc).__name__}: {exc}")
            if ctx["cuda"]:
                try:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                except Exception as again:  # a sticky CUDA error: later cases will say so
                    out["cases"][label]["cuda_state"] = repr(again)
        out["elapsed_s"] = time.monotonic() - T0
        _write(out, name)
    ran = [c for c in out["cases"].values() if "skipped" not in c]
    out["summary"] = {
        "cases": len(out["cases"]),
        "ran": len(ran),
        "passed": sum(bool(c.get("passed")) for c in ran),
        "failed": failures,
        "speedup_vs_dequant_matmul_T1": {
            c["label"]: c["throughput"]["T1"]["speedup_vs_dequant_matmul"] for c in ran if "throughput" in c
        },
    }
    out["elapsed_s"] = time.monotonic() - T0
    _write(out, name)
    faulthandler.cancel_dump_traceback_later()
    log(f"done: {json.dumps(out['summary'])}")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
