"""Reliability figures: random SIGKILLs, 16 racing writers with gc, pulls through a faulting S3 proxy.

    .venv/bin/python bench/bench_reliability.py [--kills 300] [--races 3] [--pull-rounds 40] [--out FILE.json]

The heavier runs of tests/reliability (same harness, tests/crashes.py), on the local store and on
SeaweedFS (``weed mini`` on 127.0.0.1):

- ``kills``: SIGKILL of a real ``registry`` process (push, convert, tag, rollback, gc in turn) after a
  delay drawn uniformly over its unkilled run time; then fsck (must be clean), the same command again
  (must complete with the unkilled digest and tag head), and at the end gc once the killed leases have
  expired (no stale upload left, every tag verifies). Figures: fsck-clean rate, re-run-completed rate,
  how many kills landed before the command finished, and how many after it had written something.
- ``races``: 16 ``push --retry`` writers to one tag with ``gc --grace-seconds 0`` looping beside them,
  half of them reusing garbage blobs. Figures: lost updates, duplicate versions, fsck.
- ``pulls``: full and per-rank pulls through tests/faultproxy.py (reset, truncate, 500, flipped byte;
  uncapped, so some pulls exhaust their retries). Figure: unverified bytes written (DEST differing
  from an unfaulted pull after a success, or changed after a failure).

A trial whose check fails is counted (``failures``) and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import crashes
from faultproxy import FaultProxy, object_get
from llama_artifacts import cli, ok
from servers import S3Server, start_seaweedfs

MODES = ("reset", "truncate", "error", "flip")


@contextmanager
def backend(kind: str, server: S3Server | None, work: Path) -> Iterator[str]:
    """A fresh store URL and $SHARDPORT_HOME for one campaign."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    os.environ["SHARDPORT_HOME"] = str(home)
    if kind == "local":
        yield str(Path(tempfile.mkdtemp(prefix="store-", dir=work)) / "store")
        return
    assert server is not None
    os.environ.update(server.env())
    yield f"s3://{server.new_bucket()}/registry"


def kill_campaign(store: str, work: Path, kills: int, seed: int) -> dict[str, Any]:
    start = time.monotonic()
    bench = crashes.prepare(store, work)
    rng = random.Random(seed)
    tally = crashes.Tally()
    failures: list[dict[str, str]] = []
    for i in range(kills):
        op = crashes.OPS[i % len(crashes.OPS)]
        try:
            crashes.trial(bench, op, rng, tally)
        except AssertionError as exc:
            failures.append({"op": op, "trial": str(i), "error": str(exc)[:1000]})
    try:
        audit: dict[str, Any] = crashes.final_audit(bench)
    except AssertionError as exc:
        audit = {"error": str(exc)[:1000]}
    figures = tally.to_json()
    figures.update(
        attempted=kills,
        failures=failures,
        final_audit=audit,
        calibrated_run_seconds={k: round(v, 2) for k, v in bench.durations.items()},
        seconds=round(time.monotonic() - start, 1),
    )
    return figures


def flaky_pulls(server: S3Server, store: str, work: Path, rounds: int, seed: int) -> dict[str, Any]:
    from bringup_artifacts import gptq_tiny

    ok(store, "keygen")
    ok(store, "push", gptq_tiny(work / "src"), "flaky/q:v1")
    tally = {"pulls": 0, "completed": 0, "failed_clean": 0, "unverified_bytes_written": 0, "faults": 0}
    cleans: dict[tuple[str, ...], dict[str, bytes]] = {}

    def tree(root: Path) -> dict[str, bytes] | None:
        if not root.exists():
            return None
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".ledger.json")
        }

    for n in range(rounds):
        opts = [] if n % 3 == 0 else ["--tp", "2", "--rank", str(n % 2)]
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        if tuple(opts) not in cleans:
            ok(store, "pull", "flaky/q:v1", work / f"clean{n}", *opts)
            cleans[tuple(opts)] = tree(work / f"clean{n}") or {}
        dest = work / f"dest{n}"
        if n % 2:
            ok(store, "pull", "flaky/q:v1", dest, *opts)
        before = tree(dest)
        with FaultProxy(server.endpoint, rate=0.15, modes=MODES, seed=seed + n, match=object_get) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
            code, _ = cli(store, "pull", "flaky/q:v1", dest, *opts)
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        tally["pulls"] += 1
        tally["faults"] += proxy.faults
        after = tree(dest)
        if code == 0:
            tally["completed"] += 1
            wrong = after != cleans[tuple(opts)]
        else:
            tally["failed_clean"] += after == before
            wrong = after != before
        if wrong:  # count the bytes of every file that differs from what a verified pull writes
            expect = cleans[tuple(opts)] if code == 0 else (before or {})
            tally["unverified_bytes_written"] += sum(
                len(v) for k, v in (after or {}).items() if expect.get(k) != v
            )
    return tally


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=300, help="random kills per backend")
    ap.add_argument("--races", type=int, default=3, help="16-writer races per backend")
    ap.add_argument("--pull-rounds", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-reliability-"))
    results: dict[str, Any] = {"cpus": os.cpu_count(), "kills_per_backend": args.kills, "backends": {}}
    server = start_seaweedfs()
    try:
        for kind in ("local", "seaweedfs"):
            figures: dict[str, Any] = {}
            with backend(kind, server, work) as store:
                figures["kills"] = kill_campaign(store, work / f"{kind}-kills", args.kills, args.seed)
            races = []
            for r in range(args.races):
                with backend(kind, server, work) as store:
                    ok(store, "keygen")
                    t = time.monotonic()
                    race = crashes.race(store, work / f"{kind}-race{r}", writers=16, seed=r)
                    race["seconds_total"] = round(time.monotonic() - t, 1)
                    races.append(race)
            figures["races"] = {
                "runs": len(races),
                "writers_each": 16,
                "lost_updates": sum(r["lost_updates"] for r in races),
                "duplicate_versions": sum(r["duplicate_versions"] for r in races),
                "failed_writers": sum(len(r["failed_writers"]) for r in races),
                "gc_runs": sum(r["gc_runs"] for r in races),
                "gc_failures": sum(len(r["gc_failures"]) for r in races),
                "fsck_clean": sum(bool(r["fsck_ok"]) for r in races),
                "details": races,
            }
            results["backends"][kind] = figures
            print(
                json.dumps({kind: {k: v for k, v in figures["kills"].items() if k != "failures"}}), flush=True
            )
        with backend("seaweedfs", server, work) as store:
            results["flaky_s3_pulls"] = flaky_pulls(
                server, store, work / "flaky", args.pull_rounds, args.seed
            )
    finally:
        server.stop()
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
