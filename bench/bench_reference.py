"""The driver's float32 reference (parity L4): streamed by layer vs the whole model decoded at once.

    .venv/bin/python bench/bench_reference.py [--size quick|full] [--generate 8] [--only streamed]

Builds the bring-up benchmark's llama GGUF (:mod:`bench_bringup`: Q4_0 linears, Q8_0 ``attn_v`` and a
tied Q8_0 embedding; ~170 MiB at ``--size quick``), pushes it to a local store, then runs each
reference in a fresh process: ``whole`` — the driver's reference before streaming (the whole
checkpoint loaded at tp 1, every weight decoded to float32, ``reference_model(...).generate``) — and
``streamed`` (:func:`shardport.deploy.reference_stream.streamed_reference`, teacher-forced on the
whole reference's tokens, or on fixed tokens with ``--only streamed``). Per run: seconds, the
process's peak RSS (``VmHWM``) and its RSS before the reference (imports, store open), and for the
streamed one the float ledger's peak. Prints one JSON document (``--out`` writes it too).
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
        from shardport.deploy.reference_stream import FloatLedger, streamed_reference

        ledger = FloatLedger()
        run = tokens if tokens is not None else [(7 * i + 3) % contract.vocab for i in range(steps)]
        gen = streamed_reference(session, resolved, contract, PROMPT, run, ledger)
        out["float_ledger_peak_mib"] = round(ledger.peak / 2**20, 1)
        out["float_decoded_mib"] = round(ledger.decoded / 2**20, 1)
    out["seconds"] = round(time.perf_counter() - t, 2)
    out["peak_rss_mib"] = round(_status_mib("VmHWM"), 1)
    out["tokens"] = list(gen.tokens)
    out["prompt_logits"] = gen.prompt_logits.tolist()
    out["token_logits"] = gen.token_logits.tolist()
    return out


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=("quick", "full"), default="quick")
    ap.add_argument("--generate", type=int, default=8)
    ap.add_argument("--only", choices=("streamed",), default=None)
    ap.add_argument("--out", type=Path, default=None)
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
        whole = None
        if args.only is None:
            whole = _run_child(store, ref, "whole", args.generate, None, env)
        streamed = _run_child(
            store, ref, "streamed", args.generate, None if whole is None else whole["tokens"], env
        )
        for name, r in (("whole", whole), ("streamed", streamed)):
            if r is not None:
                doc[name] = {k: v for k, v in r.items() if not k.endswith("logits")}
        if whole is not None:
            a, b = np.array(whole["prompt_logits"]), np.array(streamed["prompt_logits"])
            ta, tb = np.array(whole["token_logits"]), np.array(streamed["token_logits"])
            doc["prompt_logits_max_abs_diff"] = float(np.abs(a - b).max())
            doc["token_logits_max_abs_diff"] = float(np.abs(ta - tb).max())
            doc["tokens_equal"] = whole["tokens"] == streamed["tokens"]
            doc["peak_rss_ratio"] = round(whole["peak_rss_mib"] / streamed["peak_rss_mib"], 2)
            above = [r["peak_rss_mib"] - r["rss_before_mib"] for r in (whole, streamed)]
            doc["peak_rss_above_baseline_ratio"] = round(above[0] / above[1], 2)
            doc["seconds_ratio"] = round(whole["seconds"] / streamed["seconds"], 2)
        text = json.dumps(doc, indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
