"""CUDA bring-up check: the int4 kernel, then the tp 1 runtime graph on the GPU vs the CPU float32 reference.

ONE prepared script for a machine with one CUDA device, unattended, in under 3 minutes:

1. ``kernels`` — :mod:`bench.cuda_kernels`'s cases (GPTQ and AWQ g128, GGUF Q4_0/Q4_1, a tp 2 K slice,
   innerKTiles 2 and 4) at ``N = K = --size`` (1024), without the throughput runs: dispatch must select
   ``cuda.int4-tinygemm`` and its parity ladder L0-L3 must hold;
2. ``graph_float32`` — a random llama-shaped model (2 layers, hidden 512, 8 query / 4 kv heads of 64,
   intermediate 1024, vocabulary 1001) run by :class:`~shardport.deploy.graph.RankModel` on ``cuda:0``
   (every float weight, the KV cache, the rotary tables on the device; TF32 off) against the same model
   on the CPU (:func:`~shardport.deploy.graph.reference_model`): max |Δ| of the prompt and decode
   logits, top-1 per position, greedy tokens;
3. ``graph_int4`` — the same model with every layer's linear quantized to GPTQ int4 (g128) and prepared
   by :func:`~shardport.kernels.dispatch` for the CUDA device with bfloat16 activations (tinygemm; the
   embedding and the head stay float on the device), against the CPU float32 graph over the registry's
   reference decode of those weights; a top-1 difference where the reference's own top-2 margin is
   within 2 x max |Δ| is reported as a near tie (bfloat16 activations), any other fails;
4. ``bringup`` — a tiny GPTQ checkpoint pushed to a temporary local store (keygen, push) and brought up
   in this process (``bring_up`` with ``run_in_process``, world 1: no NCCL): the rank sees the GPU, its
   graph runs on it, and the evidence predicate's L4 (vs the driver's CPU float32 reference) and L5
   (including the device-memory check) must pass. ``--fallback allow``: the graph's activations are
   float32 and tinygemm takes bfloat16 only, so the weights run through the full-dequant kernel on the
   device until the bfloat16 activation option is used.

Results: one JSON summary line on stdout (the last line) and the whole record in
``bench/results/cuda_bringup.json`` (and in ``$OUT`` when it names a folder), rewritten after every step.
Exit status: 0 all passed, 1 a step failed, 2 no CUDA device, 3 shardport or a dependency is missing.

``--dry-run``: the same four steps on the CPU (``cpu.int4pack`` for the kernels, the graphs on
``torch.device("cpu")``, smaller kernel cases): checks the script's plumbing where no GPU is and writes
``cuda_bringup.dry-run.json``.

Dependencies: run from the repository root (``python bench/cuda_bringup.py``) with the project installed
as the README says (``pip install -e . -c constraints.txt``) or at least torch (a CUDA build on the GPU
machine), numpy, pydantic, gguf (steps 1-3) plus safetensors, cryptography, rfc8785, blake3, fsspec,
psutil and the rest of the registry's dependencies (step 4). The checkpoint builders are imported from
``tests/`` (quantized.py, bringup_artifacts.py, llama_artifacts.py). No Ray, no network.

Usage: python bench/cuda_bringup.py [--dry-run] [--size 1024] [--budget 170] [--results DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT / "tests")]

import cuda_kernels as ck  # noqa: E402 - the kernel cases, the bootstrap and the writer are shared

PROMPT = [1, 5, 900, 33, 7, 1000, 2, 64]
STEPS = 6
GROUP = 128
KERNEL_CASES = (
    "gptq_g128",
    "awq_g128",
    "gguf_q4_0",
    "gguf_q4_1",
    "gptq_tp2_rank1",
    "gptq_k96_inner2",
    "awq_k192_inner4",
)
LINEARS = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}


def contract() -> Any:
    """The bring-up model's graph contract (every linear's N a multiple of 8, K of 128)."""
    from shardport.registry.contracts.graph import GraphContract

    return GraphContract(
        architecture="LlamaForCausalLM",
        source="config.json",
        layers=2,
        hidden=512,
        heads=8,
        kv_heads=4,
        head_dim=64,
        intermediate=1024,
        vocab=1001,
        rope_base=10000.0,
        rope_pairs="half",
        norm_eps=1e-5,
        tied_embeddings=False,
    )


def parity_record(run: Any, ref: Any, tolerance: float) -> dict[str, Any]:
    """max |Δ|, top-1 per position and greedy tokens of ``run`` vs ``ref``, near ties named."""
    import torch

    from shardport.deploy.graph import compare

    parity = compare(run, ref, tolerance)
    worst = max(parity.max_abs_diff, parity.decode_max_abs_diff)
    top2 = torch.topk(ref.prompt_logits, 2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    misses = [i for i, same in enumerate(parity.top1_agree) if not same]
    ties = [i for i in misses if margins[i] <= 2 * worst]
    first = next((j for j, (a, b) in enumerate(zip(run.tokens, ref.tokens, strict=False)) if a != b), None)
    tie_at_divergence = first is not None and bool(
        torch.topk(ref.token_logits[first], 2).values.diff().abs().item() <= 2 * worst
    )
    return {
        "max_abs_diff": parity.max_abs_diff,
        "decode_max_abs_diff": parity.decode_max_abs_diff,
        "tolerance": tolerance,
        "top1_agree": list(parity.top1_agree),
        "near_ties": ties,
        "min_margin": min(margins),
        "tokens": list(run.tokens),
        "reference_tokens": list(ref.tokens),
        "greedy_identical": run.tokens == ref.tokens,
        "first_divergence": first,
        "divergence_is_near_tie": tie_at_divergence,
        "logits_device": str(run.prompt_logits.device),
    }


def graph_float32(device: Any) -> dict[str, Any]:
    """The float model on ``device`` vs the same model on the CPU (float32 both)."""
    from shardport.deploy.graph import random_model, reference_model

    model = random_model(contract(), seed=7)
    t0 = time.perf_counter()
    ref = reference_model(model).generate(PROMPT, STEPS)
    cpu_s = time.perf_counter() - t0
    graph = reference_model(model, device=device)
    graph.generate(PROMPT, 1)  # warm-up (CUDA context, kernels)
    t0 = time.perf_counter()
    run = graph.generate(PROMPT, STEPS)
    record = parity_record(run, ref, 1e-3)
    record |= {"device": str(graph.device), "cpu_s": cpu_s, "device_s": time.perf_counter() - t0}
    record["passed"] = (
        record["max_abs_diff"] <= 1e-3
        and record["decode_max_abs_diff"] <= 1e-3
        and all(record["top1_agree"])
        and record["greedy_identical"]
    )
    return record


def _int4_weight(w: Any, name: str) -> tuple[Any, Any]:
    """A GPTQ int4 (g128) rank weight of float ``w [N, K]`` and its reference decode (float32)."""
    import numpy as np
    from quantized import gptq_planes, inventory, quantize_minmax

    from shardport.kernels import rank_weight
    from shardport.registry.contracts import infer_safetensors
    from shardport.registry.contracts.decode import decode_weight

    prefix = name.removesuffix(".weight")
    planes = gptq_planes(quantize_minmax(w.numpy().astype(np.float32), GROUP), prefix)
    config = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False}
    logical = next(
        x for x in infer_safetensors({"quantization_config": config}, inventory(planes)) if x.name == name
    )
    rw = rank_weight(logical, planes)
    return rw, decode_weight(rw.local_weight, rw.named_planes)


def graph_int4(device: Any, kernel_device: Any, expect: str) -> dict[str, Any]:
    """Every layer's linear as a prepared int4 operator with bfloat16 activations on ``device``."""
    import dataclasses

    import torch

    from shardport.deploy.graph import (
        Attention,
        Layer,
        Mesh,
        Mlp,
        RankModel,
        RankWeights,
        random_model,
        reference_model,
    )
    from shardport.deploy.graph.layout import single_layout
    from shardport.deploy.graph.reference import FloatMlp
    from shardport.deploy.graph.weights import float_linear, float_lookup
    from shardport.kernels import default_catalog, dispatch

    c = contract()
    base = random_model(c, seed=8)
    ops: dict[tuple[int, str], Any] = {}
    decoded: list[Any] = []
    selected: set[str] = set()
    t0 = time.perf_counter()
    for i, f in enumerate(base.layers):
        assert f.mlp is not None
        floats = {
            "q": f.q,
            "k": f.k,
            "v": f.v,
            "o": f.o,
            "gate": f.mlp.gate,
            "up": f.mlp.up,
            "down": f.mlp.down,
        }
        deq: dict[str, Any] = {}
        for slot, w in floats.items():
            rw, values = _int4_weight(w, f"model.layers.{i}.{LINEARS[slot]}.weight")
            op, trace = dispatch(
                rw, default_catalog(), activation_dtype="bfloat16", phase="decode", device=kernel_device
            )
            selected.add(trace.selected)
            ops[(i, slot)] = op
            deq[slot] = torch.from_numpy(values)
        mlp = FloatMlp(deq["gate"], deq["up"], deq["down"])
        decoded.append(dataclasses.replace(f, q=deq["q"], k=deq["k"], v=deq["v"], o=deq["o"], mlp=mlp))
    prepare_s = time.perf_counter() - t0
    reference = dataclasses.replace(base, layers=tuple(decoded))

    def bf16(op: Any) -> Callable[[Any], Any]:
        def linear(x: Any) -> Any:
            return op(x.to(torch.bfloat16).contiguous()).to(torch.float32)

        return linear

    layers = tuple(
        Layer(
            i,
            f.input_norm.to(device),
            Attention(*(bf16(ops[(i, s)]) for s in ("q", "k", "v", "o"))),
            f.post_norm.to(device),
            Mlp(*(bf16(ops[(i, s)]) for s in ("gate", "up", "down"))),
        )
        for i, f in enumerate(base.layers)
    )
    assert base.head is not None
    weights = RankWeights(
        layers=layers,
        embed=float_lookup(base.embed, device),
        norm=base.norm.to(device),
        head=float_linear(base.head, device),
    )
    graph = RankModel(c, single_layout(c), weights, Mesh.local(), device=device)
    ref = reference_model(reference).generate(PROMPT, STEPS)
    graph.generate(PROMPT, 1)
    t0 = time.perf_counter()
    run = graph.generate(PROMPT, STEPS)
    record = parity_record(run, ref, 0.0)
    record |= {
        "device": str(graph.device),
        "selected": sorted(selected),
        "expected_kernel": expect,
        "prepare_s": prepare_s,
        "device_s": time.perf_counter() - t0,
    }
    misses = [i for i, same in enumerate(record["top1_agree"]) if not same]
    greedy_ok = record["greedy_identical"] or record["divergence_is_near_tie"]
    record["passed"] = selected == {expect} and set(misses) <= set(record["near_ties"]) and greedy_ok
    return record


def bringup(fallback: str) -> dict[str, Any]:
    """A tiny GPTQ checkpoint pushed to a temporary store and brought up here (world 1)."""
    with tempfile.TemporaryDirectory(prefix="sp-cuda-bringup-") as tmp:
        os.environ["SHARDPORT_HOME"] = str(Path(tmp) / "home")
        from bringup_artifacts import gptq_tiny

        from shardport.cli import main
        from shardport.deploy.ray_ranks import run_in_process
        from shardport.deploy.up import UpRequest, bring_up
        from shardport.registry.session import Session

        store = str(Path(tmp) / "store")
        for args in (["keygen"], ["push", str(gptq_tiny(Path(tmp) / "gptq")), "llama/gptq:v1"]):
            with contextlib.redirect_stdout(io.StringIO()):
                code = main(["--store", store, "--json", *args])
            if code != 0:
                raise RuntimeError(f"registry {args[0]} exited {code}")
        request = UpRequest(
            ref="llama/gptq:v1",
            tokens=(1, 5, 300, 7, 396),
            steps=4,
            store=store,
            fallback=fallback,  # type: ignore[arg-type]
        )
        result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    p = result.predicate
    (report,) = result.reports
    rows = [{"level": r["level"], "passed": r["passed"], "name": r.get("name")} for r in p["parity"]]
    return {
        "devices": p["devices"],
        "generated": list(result.generated),
        "parity": rows,
        "l5_device": p["l5"]["device"],
        "selected": sorted({t["selected"] for t in report["dispatch"]}),
        "timeline": report["timeline"],
        "ledger": report["ledger"],
        "passed": all(r["passed"] is not False for r in rows) and any(r["level"] == "L4" for r in rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU (no GPU)")
    parser.add_argument("--size", type=int, default=None, help="kernel cases' N = K (1024; 256 dry-run)")
    parser.add_argument("--budget", type=float, default=170.0, help="seconds, then skip the rest")
    parser.add_argument("--results", type=Path, default=None, help="write the record here, not bench/results")
    args = parser.parse_args()
    name = "cuda_bringup.dry-run.json" if args.dry_run else "cuda_bringup.json"
    size = args.size or (256 if args.dry_run else 1024)
    faulthandler.enable()
    faulthandler.dump_traceback_later(args.budget + 30, exit=True)  # never hang past the limit
    out: dict[str, Any] = {
        "script": "bench/cuda_bringup.py",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "args": {**vars(args), "size": size},
        "steps": {},
    }
    try:
        import torch

        ck._bootstrap()
        from shardport.kernels import cuda_device, this_cpu
        from shardport.kernels.int4_cuda import CAPABILITY
    except ImportError as exc:
        ck._fail_early(out, name, 3, f"cannot import torch or shardport.kernels: {exc} (see the docstring)")
    out["torch"], out["torch_cuda"] = torch.__version__, torch.version.cuda
    if args.dry_run:
        kdev, expect, device = this_cpu(), "cpu.int4pack@1", torch.device("cpu")
    else:  # pragma: no cover - no GPU in CI
        kdev = cuda_device()
        if kdev is None:
            ck._fail_early(
                out, name, 2, f"no CUDA device: torch {torch.__version__} sees none; run it on a GPU"
            )
        assert kdev is not None
        expect, device = (
            f"{CAPABILITY.id}@{CAPABILITY.version}",
            torch.device("cuda", torch.cuda.current_device()),
        )
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        out["gpu"] = {"name": torch.cuda.get_device_name(), "cc": list(kdev.cc or ())}
    out["device"] = str(device)
    remaining = lambda: args.budget - (time.monotonic() - ck.T0)  # noqa: E731
    ctx = {
        "device": kdev,
        "cuda": not args.dry_run,
        "expect": expect,
        "torch_device": device,
        "clock": ck.Clock(cuda=not args.dry_run),
        "tokens": (1,),
        "repeat": 1,
        "remaining": remaining,
    }

    def kernels() -> dict[str, Any]:
        cases = {}
        for label, spec in ck._specs(size).items():
            if label in KERNEL_CASES:
                cases[label] = ck._run_case(label, {**spec, "throughput": False}, ctx)
        return {"cases": cases, "passed": all(c["passed"] for c in cases.values())}

    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "kernels": kernels,
        "graph_float32": lambda: graph_float32(device),
        "graph_int4": lambda: graph_int4(device, kdev, expect),
        "bringup": lambda: bringup("allow"),
    }
    for step, run in steps.items():
        if remaining() < 15:
            out["steps"][step] = {"skipped": "time budget spent", "passed": False}
            continue
        ck.log(f"step {step}")
        t0 = time.perf_counter()
        try:
            out["steps"][step] = run()
        except Exception as exc:  # record and go on: one broken step must not hide the others
            out["steps"][step] = {
                "passed": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=10),
            }
        out["steps"][step]["seconds"] = time.perf_counter() - t0
        ck.log(f"  {step}: {'PASSED' if out['steps'][step]['passed'] else 'FAILED'}")
        out["elapsed_s"] = time.monotonic() - ck.T0
        if args.results is None:
            ck._write(out, name)
        else:
            (args.results / name).write_text(json.dumps(out, indent=1, default=str) + "\n")
    faulthandler.cancel_dump_traceback_later()
    brief = {
        step: {
            k: v
            for k, v in r.items()
            if k in ("passed", "error", "max_abs_diff", "greedy_identical", "devices", "selected", "seconds")
        }
        for step, r in out["steps"].items()
    }
    passed = all(r["passed"] for r in out["steps"].values())
    print(
        json.dumps({"passed": passed, "device": out["device"], "elapsed_s": out["elapsed_s"], "steps": brief})
    )
    return 0 if passed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
