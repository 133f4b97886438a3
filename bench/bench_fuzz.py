"""Fuzz every parser of untrusted bytes for a while and print the figures as JSON.

The heavier run of ``tests/reliability/test_fuzz_parsers.py``: the same parsers and seeds
(``tests/fuzz_targets.py``, seeds from a store built by ``tests/tamper_world.py``), many more inputs.
Per parser: inputs tried, how many were accepted and refused (by error type), bugs (any exception that
is not a ShardportError, by type and message), the slowest input, and the largest allocation
(``tracemalloc`` peak, on every ``--memory-every``-th input) against the stated bound (8 MiB + 64 x
the input). Exit 1 if any bug, hang (an input over ``--deadline`` seconds) or allocation over the
bound was seen.

    python bench/bench_fuzz.py --seconds 15 --out bench/results/fuzz.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_targets import BYTE_OPS, Target, memory_bound, mutate_bytes, mutate_json, run_one, targets
from tamper_world import World, build, home_at


def fuzz(
    target: Target, seconds: float, rng: random.Random, deadline: float, memory_every: int
) -> dict[str, Any]:
    refused: collections.Counter[str] = collections.Counter()
    bugs: collections.Counter[str] = collections.Counter()
    tried = accepted = slow = over = measured = 0
    worst_s, worst_ratio, peak = 0.0, 0.0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        seed = rng.choice(target.seeds)
        kind = rng.random()
        if target.is_json and kind < 0.4:
            raw = mutate_json(seed, rng.randrange(2**32))
        elif kind < 0.95:
            ops = [
                (rng.randrange(len(BYTE_OPS)), rng.randrange(2**32), rng.randrange(2**64))
                for _ in range(rng.randint(1, 6))
            ]
            raw = mutate_bytes(seed, ops, target.seeds)
        else:
            raw = rng.randbytes(rng.randrange(1024))
        memory = memory_every > 0 and tried % memory_every == 0
        out = run_one(target, raw, measure_memory=memory)
        tried += 1
        accepted += out.accepted
        if out.refused:
            refused[out.refused] += 1
        if out.bug:
            bugs[out.bug[:160]] += 1
        worst_s = max(worst_s, out.seconds)
        slow += out.seconds > deadline
        if out.peak_bytes is not None:
            measured += 1
            peak = max(peak, out.peak_bytes)
            worst_ratio = max(worst_ratio, out.peak_bytes / max(len(raw), 1))
            over += out.peak_bytes > memory_bound(raw)
    return {
        "inputs": tried,
        "accepted": accepted,
        "refused": sum(refused.values()),
        "refused_by_type": dict(refused.most_common()),
        "bugs": sum(bugs.values()),
        "bug_kinds": dict(bugs),
        "slowest_input_s": round(worst_s, 4),
        "over_deadline": slow,
        "memory_measured": measured,
        "peak_alloc_bytes": peak,
        "over_memory_bound": over,
        "worst_alloc_per_input_byte": round(worst_ratio, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="fuzzing time per parser")
    ap.add_argument("--deadline", type=float, default=2.0, help="an input slower than this is a hang")
    ap.add_argument("--memory-every", type=int, default=20, help="tracemalloc every N-th input (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp:
        root = Path(tmp)
        with home_at(root / "home"):
            parsers = targets(World(root, build(root)), root)
            per = {
                name: fuzz(t, args.seconds, rng, args.deadline, args.memory_every)
                for name, t in parsers.items()
            }
    totals = {
        key: sum(p[key] for p in per.values())
        for key in ("inputs", "accepted", "refused", "bugs", "over_deadline", "over_memory_bound")
    }
    result = {
        "benchmark": "fuzz",
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
        "settings": {
            "seconds_per_parser": args.seconds,
            "deadline_s": args.deadline,
            "memory_every": args.memory_every,
            "memory_bound": "8 MiB + 64 x input bytes",
            "seed": args.seed,
        },
        "parsers": per,
        "totals": totals,
        "ok": totals["bugs"] == 0 and totals["over_deadline"] == 0 and totals["over_memory_bound"] == 0,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
