"""What the driver of ``registry up`` now does before the Ray start (``up.admit``), and the plan after it.

    .venv/bin/python bench/bench_admission.py [--size quick|full] [--repeat 7] [--out FILE.json]

``admit`` (flags, resolve, the manifest's sizes, kernels) runs before the launch starts; the inventory
check and placement plan (``_plan_admitted``) still overlap it (``start_while_planning``). The Ray start
used to begin at once, so what a bring-up's time to first token can lose is ``admit``'s time. Times both
in-process (imports warm, as in the CLI after its first resolve) on bench_bringup's GGUF at tp 4 (the
same ~170 MiB ``quick`` or ~1 GiB ``full`` checkpoint), medians over ``--repeat`` runs, and the first
(cold) run on its own; also reports that neither imported torch or Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_bringup import HIDDEN, REGISTRY, SIZES, VOCAB, layer_bytes, make_gguf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=sorted(SIZES), default="quick")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    embed = VOCAB * HIDDEN * 34 // 32
    layers = max(1, round((SIZES[args.size] - embed) / layer_bytes()))
    work = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    try:
        os.environ["SHARDPORT_HOME"] = str(work / "home")
        os.environ.pop("SHARDPORT_STORE", None)
        store = str(work / "store")
        make_gguf(work / "gguf", layers)
        for cmd in (["keygen"], ["push", str(work / "gguf"), "bench/llama-q4:prod"]):
            subprocess.run([REGISTRY, "--store", store, "--json", *cmd], check=True, capture_output=True)

        from shardport.deploy.up import UpRequest, _plan_admitted, admit
        from shardport.registry.session import Session

        request = UpRequest(ref="bench/llama-q4:prod", tokens=(1, 2, 3, 4), tp=args.tp, store=store)
        admitted, planned = [], []
        for _ in range(args.repeat + 1):
            session = Session.open(store)
            t = time.perf_counter()
            ok = admit(session, request, store_evidence=True)
            admitted.append(time.perf_counter() - t)
            t = time.perf_counter()
            _plan_admitted(ok)
            planned.append(time.perf_counter() - t)
        doc = {
            "size": args.size,
            "layers": layers,
            "tp": args.tp,
            "admit_cold_s": round(admitted[0], 4),
            "admit_median_s": round(statistics.median(admitted[1:]), 4),
            "plan_cold_s": round(planned[0], 4),
            "plan_median_s": round(statistics.median(planned[1:]), 4),
            "imported": sorted(m for m in ("torch", "ray") if m in sys.modules),
        }
        text = json.dumps(doc, indent=2)
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
