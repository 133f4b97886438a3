"""The driver's float32 reference (parity L4): streamed by layer vs the whole model decoded at once.

    .venv/bin/python bench/bench_reference.py [--size quick|full] [--generate 8] [--only streamed,...]
        [--up BASELINE_REGISTRY --tp 2 --repeat 2]

Builds the bring-up benchmark's llama GGUF (:mod:`bench_bringup`: Q4_0 linears, Q8_0 ``attn_v`` and a
tied Q8_0 embedding; ~170 MiB at ``--size quick``), pushes it to a local store, then runs each
reference in a fresh process: ``whole`` — the driver's reference before streaming (the whole
checkpoint loaded at tp 1, every weight decoded to float32, ``reference_model(...).generate``) — and
``streamed`` (:func:`shardport.deploy.reference_stream.streamed_reference`, teacher-forced on the
whole reference's tokens, or on fixed tokens with ``--only``), and ``transformers``
(:func:`shardport.deploy.reference_stream.driver_reference`: transformers' own decoder layers, streamed
and teacher-forced the same way; the driver's L4 reference since issue 27). Per run: seconds, the
process's peak RSS (``VmHWM``) and its RSS before the reference (imports, store open), and for the
streamed ones the float ledger's peak. ``--up``: ``registry up`` of the same checkpoint by another
checkout's CLI (the reference before, e.g. ``/work/main/.venv/bin/registry``) and by this one,
alternating ``--repeat`` times (:func:`bench_bringup.run_up`: the driver's peak RSS, time to first token,
wall). Prints one JSON document (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

PROMPT = (1, 17, 42, 300, 7)


def _status_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (this process's peak) from /proc/self/status, in MiB.

    Not ``ru_maxrss``: Linux carries it across fork and exec, so a child would report at least the
    peak of the parent that built the checkpoint.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _child(store: str, ref: str, which: str, steps: int, tokens: list[int] | None) -> dict[str, Any]:
    import numpy as np
    import torch

    from shardport.deploy.contract import contract_of
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.session import Session
    from shardport.registry.trust.resolve import resolve

    torch.set_num_threads(1)
    session = Session.open(store)
    resolved = resolve(session, parse_ref(ref))
    contract = contract_of(resolved.manifest)
    out: dict[str, Any] = {
        "which": which,
        "rss_before_mib": round(_status_mib("VmRSS"), 1),
        "peak_rss_before_mib": round(_status_mib("VmHWM"), 1),
    }
    t = time.perf_counter()
    if which == "whole":
        from shardport.deploy.graph.checkpoint import float_model
        from shardport.deploy.graph.reference import reference_model
        from shardport.loader import load_rank
        from shardport.placement import Topology
        from shardport.registry.contracts.decode import decode_weight

        whole = load_rank(session, resolved, Topology(tp=1), 0)
        planes: dict[str, dict[str, Any]] = {}
        for x in whole.tensors:
            if x.weight is not None:
                planes.setdefault(x.weight, {})[x.tensor] = x.array
        weights = {w.name: w for w in resolved.manifest.weights or []}
        tensors = {
            name: torch.from_numpy(np.ascontiguousarray(decode_weight(weights[name], p)))
            for name, p in planes.items()
        }
        gen = reference_model(float_model(contract, tensors)).generate(list(PROMPT), steps)
    else:
        from shardport.deploy.reference_stream import FloatLedger, driver_reference, streamed_reference

        ledger = FloatLedger()
        run = tokens if tokens is not None else [(7 * i + 3) % contract.vocab for i in range(steps)]
        if which == "transformers":
            import transformers  # noqa: F401  (timed apart: the driver imports it once)

            out["import_transformers_seconds"] = round(time.perf_counter() - t, 2)
            out["rss_after_import_mib"] = round(_status_mib("VmRSS"), 1)
            t = time.perf_counter()
            gen, out["reference"] = driver_reference(session, resolved, contract, PROMPT, run, ledger)
        else:
            gen = streamed_reference(session, resolved, contract, PROMPT, run, ledger)
        out["float_ledger_peak_mib"] = round(ledger.peak / 2**20, 1)
        out["float_decoded_mib"] = round(ledger.decoded / 2**20, 1)
    out["seconds"] = round(time.perf_counter() - t, 2)
    out["peak_rss_mib"] = round(_status_mib("VmHWM"), 1)
    out["tokens"] = list(gen.tokens)
    out["prompt_logits"] = gen.prompt_logits.tolist()
    out["token_logits"] = gen.token_logits.tolist()
    return out


def _versus(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` against ``b`` (the same prompt and fed tokens): logits, argmax, seconds, memory."""
    import numpy as np

    pa, pb = np.array(a["prompt_logits"]), np.array(b["prompt_logits"])
    ta, tb = np.array(a["token_logits"]), np.array(b["token_logits"])
    return {
        "prompt_logits_max_abs_diff": float(np.abs(pa - pb).max()),
        "token_logits_max_abs_diff": float(np.abs(ta - tb).max()),
        "max_abs_logit": float(np.abs(pb).max()),
        "tokens_equal": a["tokens"] == b["tokens"],
        "seconds_ratio": round(a["seconds"] / b["seconds"], 2),
        "peak_rss_ratio": round(a["peak_rss_mib"] / b["peak_rss_mib"], 2),
        "float_ledger_peak_ratio": round(a["float_ledger_peak_mib"] / b["float_ledger_peak_mib"], 3),
    }


def _run_child(
    store: str, ref: str, which: str, steps: int, tokens: list[int] | None, env: dict[str, str]
) -> Any:
    args = [
        sys.executable,
        __file__,
        "--child",
        which,
        "--store",
        store,
        "--ref",
        ref,
        "--generate",
        str(steps),
    ]
    if tokens is not None:
        args += ["--tokens", ",".join(map(str, tokens))]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{which}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def _up(env: dict[str, str], store: str, ref: str, baseline: str, tp: int, steps: int, repeat: int) -> Any:
    """``registry up`` by ``baseline``'s CLI and this one's, alternating: the driver's peak, TTFT, wall."""
    import bench_bringup

    ours = bench_bringup.REGISTRY
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    for _ in range(repeat):
        for name, cli in (("baseline", baseline), ("this", ours)):
            bench_bringup.REGISTRY = cli
            r = bench_bringup.run_up(env, store, ref, tp, steps)
            # --json prints no progress lines: time to first token as the ranks' own (the slowest rank's
            # stages from resolve to its first token; the driver's reference runs after them)
            first = max(sum(float(v) for v in t.values()) for t in r["timeline"].values())
            runs[name].append({
                "passed": r["passed"], "driver_peak_rss_mib": round(r["driver_peak_rss_bytes"] / 2**20, 1),
                "rank_seconds_to_first_token": round(first, 2),
                "seconds_cli_wall": round(r["seconds_cli_wall"], 2), "l4": r["l4"],
            })  # fmt: skip
            print(json.dumps({name: runs[name][-1]}), file=sys.stderr, flush=True)
    bench_bringup.REGISTRY = ours

    def median(name: str, key: str) -> float:
        values = sorted(float(x[key]) for x in runs[name])
        return (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2

    keys = ("driver_peak_rss_mib", "rank_seconds_to_first_token", "seconds_cli_wall")
    ratios = {f"{k}_this_over_baseline": round(median("this", k) / median("baseline", k), 3) for k in keys}
    return {"baseline_cli": baseline, "tp": tp, "runs": runs, "median_ratios": ratios}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=("quick", "full"), default="quick")
    ap.add_argument("--generate", type=int, default=8)
    ap.add_argument("--only", default=None, help="comma-separated: streamed, transformers (no whole)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--up", default=None, help="another checkout's registry CLI: registry up by both")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ref", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        tokens = None if args.tokens is None else [int(t) for t in args.tokens.split(",")]
        print(json.dumps(_child(args.store, args.ref, args.child, args.generate, tokens)))
        return 0

    import numpy as np
    from bench_bringup import HIDDEN, SIZES, VOCAB, layer_bytes, make_gguf, registry

    layers = max(1, round((SIZES[args.size] - VOCAB * HIDDEN * 34 // 32) / layer_bytes()))
    work = Path(tempfile.mkdtemp(prefix="bench-reference-"))
    try:
        env = dict(os.environ)
        env["SHARDPORT_HOME"] = str(work / "home")
        env.pop("SHARDPORT_STORE", None)
        store, ref = str(work / "store"), "bench/llama-q4:prod"
        size = make_gguf(work / "gguf", layers)
        registry(env, store, "keygen")
        registry(env, store, "push", str(work / "gguf"), ref)
        shutil.rmtree(work / "gguf")
        doc: dict[str, Any] = {"size": args.size, "bytes": size, "layers": layers, "generate": args.generate}
        only = ["whole", "streamed", "transformers"] if args.only is None else args.only.split(",")
        whole = _run_child(store, ref, "whole", args.generate, None, env) if "whole" in only else None
        tokens = None if whole is None else whole["tokens"]
        runs = {w: _run_child(store, ref, w, args.generate, tokens, env) for w in only if w != "whole"}
        streamed, hf = runs.get("streamed"), runs.get("transformers")
        for name, r in (("whole", whole), ("streamed", streamed), ("transformers", hf)):
            if r is not None:
                doc[name] = {k: v for k, v in r.items() if not k.endswith("logits")}
        if streamed is not None and hf is not None:
            doc["transformers_vs_streamed"] = _versus(hf, streamed)
        print(json.dumps({k: v for k, v in doc.items() if k != "whole"}), file=sys.stderr, flush=True)
        if whole is not None and streamed is not None:
            a, b = np.array(whole["prompt_logits"]), np.array(streamed["prompt_logits"])
            ta, tb = np.array(whole["token_logits"]), np.array(streamed["token_logits"])
            doc["prompt_logits_max_abs_diff"] = float(np.abs(a - b).max())
            doc["token_logits_max_abs_diff"] = float(np.abs(ta - tb).max())
            doc["tokens_equal"] = whole["tokens"] == streamed["tokens"]
            doc["peak_rss_ratio"] = round(whole["peak_rss_mib"] / streamed["peak_rss_mib"], 2)
            above = [r["peak_rss_mib"] - r["rss_before_mib"] for r in (whole, streamed)]
            doc["peak_rss_above_baseline_ratio"] = round(above[0] / above[1], 2)
            doc["seconds_ratio"] = round(whole["seconds"] / streamed["seconds"], 2)
        if args.up:
            doc["registry_up"] = _up(env, store, ref, args.up, args.tp, args.generate, args.repeat)
        text = json.dumps(doc, indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
