"""Bring-up faults, swept: ``registry up --tp 2`` with a rank killed (SIGKILL) or drained (SIGTERM) as it
begins each of its stages, and the driver stopped (SIGTERM, SIGINT) or killed (SIGKILL, then the next
bring-up's sweep).

    .venv/bin/python bench/bench_bringup_faults.py [--stages fetch,ladder,decode] [--signals kill,term]
        [--out FILE.json]

For every case: the exit status (expected 6 for a lost rank; a stopped driver ends by its signal,
143 / 130 in the shell), the seconds from launch to exit, the one-line message (it must name the
rank and the driver's phase), and the leaks once it exited: processes of its tree still running, its
``sp-ray-*`` folders, ``.partial`` files. A case passes when all three hold. Uses the tiny GPTQ llama
of the tests (the fault paths do not depend on the model's size). The CI part is
``tests/reliability/test_bringup_faults.py``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bringup_artifacts import gptq_tiny
from bringup_procs import REGISTRY, clean_env, owned_folders, partial_files, tree, watch_up

from shardport.deploy import scratch

STAGES = ("resolve", "fetch", "repack", "ladder", "release", "join", "warm-up", "first token", "decode")
PHASE = {s: "prepare" for s in STAGES[:5]} | {s: "run" for s in STAGES[5:]}


def _up(store: str) -> list[str]:
    argv = ["--store", store, "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300", "--generate", "3"]
    return [*argv, "--no-evidence", "--ladder", "sample"]


def rank_case(work: Path, store: str, stage: str, how: str, rank: int) -> dict[str, Any]:
    failpoint = f"rank{rank}-{stage}" + (":term" if how == "term" else "")
    env = clean_env(work / "home", work, SHARDPORT_FAILPOINT=failpoint)
    t0 = time.monotonic()
    up = watch_up(_up(store), env)
    seconds = time.monotonic() - t0
    lines = [line for line in up.err.splitlines() if line.strip()]
    want = f"registry up: error: rank {rank}: its actor died during {PHASE[stage]}"
    leaks = up.leaks() + [str(p) for p in partial_files(work)]
    return {
        "case": f"rank {rank} {how} at {stage}",
        "exit": up.code,
        "seconds": round(seconds, 1),
        "message": lines[0] if lines else "",
        "lines": len(lines),
        "leaks": leaks,
        "passed": up.code == 6 and len(lines) == 1 and lines[0].startswith(want) and not leaks,
    }


def driver_case(work: Path, store: str, signum: int) -> dict[str, Any]:
    env = clean_env(work / "home", work, SHARDPORT_FAILPOINT="rank0-warm-up:pause")
    sent: list[set[int]] = []

    def stop(proc: subprocess.Popen[str], pids: set[int], sockets: set[tuple[str, str, int]]) -> None:
        if len({pid for _, name, pid in sockets if "RankActor" in name}) == 2 and not sent:
            time.sleep(3)
            sent.append(tree(proc.pid))
            proc.send_signal(signum)

    t0 = time.monotonic()
    up = watch_up(_up(store), env, act=stop)
    seconds = time.monotonic() - t0
    lines = [line for line in up.err.splitlines() if line.strip()]
    swept: list[str] = []
    if signum == signal.SIGKILL:  # nothing of its own runs: the next bring-up's sweep cleans up
        left = owned_folders(up.pid)
        swept = [str(p) for p in scratch.sweep() if p in left]
        expected = -signal.SIGKILL
    else:  # unwound, then ended by the signal (the shell shows 128 + n)
        expected = -signum
    leaks = up.leaks() + [str(p) for p in partial_files(work)]
    one_line = signum == signal.SIGKILL or len(lines) == 1
    return {
        "case": f"driver {signal.Signals(signum).name}",
        "exit": up.code,
        "seconds": round(seconds, 1),
        "message": lines[0] if lines else "",
        "lines": len(lines),
        "swept": swept,
        "leaks": leaks,
        "passed": up.code == expected and one_line and not leaks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--signals", default="kill,term")
    parser.add_argument("--driver", default="TERM,INT,KILL", help="driver signals ('' for none)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sp-faults-") as tmp:
        work = Path(tmp)
        store = str(work / "store")
        env = clean_env(work / "home", work)
        for argv in (["keygen"], ["push", str(gptq_tiny(work / "gptq")), "llama/gptq:v1"]):
            subprocess.run([*REGISTRY, "--store", store, *argv], env=env, check=True, capture_output=True)
        for stage in [s for s in args.stages.split(",") if s]:
            for how in [h for h in args.signals.split(",") if h]:
                results.append(rank_case(work, store, stage, how, rank=1))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        for name in [n for n in args.driver.split(",") if n]:
            results.append(driver_case(work, store, int(signal.Signals[f"SIG{name}"])))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    doc = {"cases": results, "passed": sum(r["passed"] for r in results), "total": len(results)}
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
