"""Where one rank's parity ladder L0-L3 spends its time, and what each ``--ladder`` budget costs.

    .venv/bin/python bench/bench_ladder.py [--work DIR] [--tp 4] [--rank 0] [--out FILE.json]

Builds the quick bring-up checkpoint of ``bench/bench_bringup.py`` (4 llama layers of hidden 2048,
intermediate 5632, vocab 32000; Q4_0 linears, Q8_0 ``attn_v`` and tied Q8_0 embedding) once under
``--work`` (kept and reused), pushes it to a local store, then loads and prepares one rank of tp
``--tp`` in this process (a :class:`~shardport.deploy.rank.Rank` with the ladder off) and:

* profiles every prepared operator's ladder, step by step: the reference decode of the slice, the
  layout's decode (L2), the codes read back (L1: through the kernel, and through the int4pack byte
  map as the sampled ladder does), the witness rows (L2), and L3 per golden batch (the kernel call,
  ``Y_ref`` and the float64 products);
* times :func:`shardport.deploy.rank_ops.run_ladders` under each budget (``full``, ``sample``, ``off``)
  on the same prepared rank, with the number of full (L2 + L3) ladders each ran.

Prints and writes one JSON document. Threads: one (a rank's share of the 2 cores at tp 4 is below one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REGISTRY = str(Path(sys.executable).parent / "registry")


def _bringup_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_bringup", HERE / "bench_bringup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(work: Path) -> tuple[str, str]:
    """The quick checkpoint pushed to ``work/store`` (once); returns (store, ref)."""
    store, ref = str(work / "store"), "bench/llama-q4:prod"
    if (work / "pushed").exists():
        return store, ref
    bb = _bringup_module()
    embed = bb.VOCAB * bb.HIDDEN * 34 // 32
    layers = max(1, round((bb.SIZES["quick"] - embed) / bb.layer_bytes()))
    bb.make_gguf(work / "gguf", layers)
    env = {**os.environ, "SHARDPORT_HOME": str(work / "home")}
    for args in (["keygen"], ["push", str(work / "gguf"), ref]):
        argv = [REGISTRY, "--store", store, "--json", *args]
        subprocess.run(argv, env=env, check=True, capture_output=True)
    (work / "pushed").write_text("ok")
    return store, ref


def _timed(seconds: dict[str, float], key: str, fn: Any, *args: Any, **kw: Any) -> Any:
    t = time.perf_counter()
    out = fn(*args, **kw)
    seconds[key] += time.perf_counter() - t
    return out


def profile(rank: Any) -> dict[str, Any]:
    """One full ladder per prepared operator, each step timed (seconds summed over operators)."""
    import torch

    from shardport.deploy.rank_ops import L3_TOKENS, _golden, _groups
    from shardport.kernels import parity, rank_weight
    from shardport.registry.contracts.decode import decode_weight

    loaded, ops = rank.loaded, rank.ops
    weights = {w.name: w for w in rank.manifest.weights or []}
    groups = _groups(loaded)
    seconds: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    count = 0
    for name, phases in sorted(ops.ops.items()):
        planes, bounds = groups[name]
        rw = rank_weight(weights[name], planes, bounds)
        for op in {id(o): o for o in phases.values()}.values():
            t0 = time.perf_counter()
            count += 1
            ref = _timed(seconds, "reference decode", decode_weight, rw.local_weight, rw.named_planes)
            layout = _timed(seconds, "layout decode (L2)", op.decode)
            _timed(seconds, "L1 code check", parity.level1, op, rw)
            if hasattr(parity, "level1_by_map"):  # the sampled ladder's L1 (byte map where one exists)
                _timed(seconds, "L1 code check by byte map", parity.level1_by_map, op, rw)
                _timed(seconds, "L1 byte-map read-back alone", op.map_codes)
            _timed(seconds, "L2 witness rows", parity._witness, rw, ref)
            _timed(seconds, "L2 compare", lambda r=ref, m=layout: np.array_equal(m, r))
            ref64 = _timed(seconds, "float64 cast of reference", lambda r=ref: r.astype(np.float64))
            for t in L3_TOKENS:
                x = _golden(rw.k_local, t, 0)
                xt = torch.from_numpy(x)
                _timed(seconds, f"L3 kernel T={t}", op, xt)
                _timed(seconds, f"L3 Y_ref float64 T={t}", lambda a=x, b=ref64: a.astype(np.float64) @ b.T)
            per_kernel[op.kernel] += time.perf_counter() - t0
    return {
        "operators": count,
        "seconds_by_step": {k: round(v, 3) for k, v in seconds.items()},
        "seconds_by_kernel": {k: round(v, 3) for k, v in per_kernel.items()},
    }


def budgets(rank: Any, modes: list[str]) -> dict[str, Any]:
    """``run_ladders`` under each budget on the same prepared rank."""
    from shardport.deploy.rank_ops import run_ladders

    weights = {w.name: w for w in rank.manifest.weights or []}
    out: dict[str, Any] = {}
    for mode in modes:
        rank.ops.ladders.clear()
        t, cpu = time.perf_counter(), time.process_time()
        try:
            run_ladders(rank.loaded, weights, rank.ops, mode=mode)
        except TypeError:  # before the budget existed: the full ladder only
            if mode != "full":
                continue
            run_ladders(rank.loaded, weights, rank.ops)
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        ladders = rank.ops.ladders
        full = sum(1 for lad in ladders if getattr(lad, "scope", "full") == "full")
        out[mode] = {
            "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu, 3),
            "ladders": len(ladders),
            "full_ladders": full,
            "passed": all(lad.passed for lad in ladders),
        }
        print(f"{mode}: {out[mode]}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-ladder"))
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--modes", default="full,sample,off")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    store, ref = build(args.work)
    os.environ["SHARDPORT_HOME"] = str(args.work / "home")

    import torch

    from shardport.deploy.rank import Rank, RankSpec
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.session import Session
    from shardport.registry.trust.resolve import resolve

    torch.set_num_threads(1)
    resolved = resolve(Session.open(store), parse_ref(ref))
    pinned = f"{resolved.ref.name}@{resolved.digest}"
    spec = RankSpec(
        ref=pinned,
        store=store,
        home=str(args.work / "home"),
        s3_endpoint=None,
        tp=args.tp,
        ep=1,
        pp=1,
        rank=args.rank,
        fallback="warn",
        prompt=(1, 2, 3),
        steps=1,
        ladder=False,
        keep_planes=True,  # the ladders run here again, on the loaded planes
    )
    rank = Rank(spec)
    t = time.perf_counter()
    summary = rank.prepare()
    if "failure" in summary:
        print(summary["failure"]["traceback"], file=sys.stderr)
        return 1
    doc: dict[str, Any] = {"tp": args.tp, "rank": args.rank, "prepare_seconds": time.perf_counter() - t}
    doc["timeline"] = dict(rank.timeline)
    if not args.no_profile:
        doc["profile"] = profile(rank)
        print(json.dumps(doc["profile"], indent=1), file=sys.stderr, flush=True)
    doc["budgets"] = budgets(rank, args.modes.split(","))
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
