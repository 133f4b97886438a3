"""Crash and race harness for tests/reliability and bench/bench_reliability.py.

Kills real ``registry`` CLI subprocesses (SIGKILL after a random delay, or at a failpoint), races
writers against ``gc``, and audits a store afterwards: ``fsck`` clean, leftovers only of the kinds fsck
documents as harmless (stale upload folders, unreferenced blobs), and ``gc`` removing those once the
killed command's lease has expired.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

REGISTRY = str(Path(sys.executable).parent / "registry")


def argv(store: str, *args: str | Path) -> list[str]:
    return [REGISTRY, "--store", store, "--json", *map(str, args)]


def run(
    store: str, *args: str | Path, env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, Any]:
    """Run the CLI as a subprocess; (exit code, parsed JSON output or the raw text when not JSON)."""
    p = subprocess.run(
        argv(store, *args),
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        return p.returncode, p.stdout + p.stderr


def ok(store: str, *args: str | Path) -> Any:
    code, out = run(store, *args)
    assert code == 0, (args, out)
    return out


@dataclass(frozen=True)
class Killed:
    """One killed run: whether the signal landed (False: the command finished first), and when."""

    landed: bool
    returncode: int
    delay: float
    output: str


def kill_after(store: str, args: list[str | Path], delay: float, env: dict[str, str] | None = None) -> Killed:
    """Start ``registry ARGS`` and SIGKILL it ``delay`` seconds later (unless it finished before)."""
    proc = subprocess.Popen(
        argv(store, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    return Killed(
        landed=proc.returncode == -signal.SIGKILL, returncode=proc.returncode, delay=delay, output=out
    )


def timed(store: str, *args: str | Path) -> tuple[float, Any]:
    """Seconds an unkilled run takes, and its output (for calibrating the kill delays)."""
    start = time.monotonic()
    out = ok(store, *args)
    return time.monotonic() - start, out


def first_write(store: str, args: list[str | Path], failpoint: str, work: Path) -> tuple[float, float]:
    """(seconds until ``registry ARGS`` reaches ``failpoint``, seconds to finish): a run paused there.

    The pause is resumed at once; the command completes like an unkilled one.
    """
    resume = work / f"resume-{failpoint}-{time.monotonic_ns()}"
    env = {"SHARDPORT_FAILPOINT": f"{failpoint}:pause", "SHARDPORT_FAILPOINT_RESUME": str(resume)}
    start = time.monotonic()
    proc = subprocess.Popen(
        argv(store, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    reached = None
    while proc.poll() is None and time.monotonic() - start < 120:
        if Path(f"{resume}.paused").exists():
            reached = time.monotonic() - start
            resume.touch()
            break
        time.sleep(0.005)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and reached is not None, (args, failpoint, out)
    return reached, time.monotonic() - start


def fsck(store: str) -> dict[str, Any]:
    """``registry fsck`` in-process (no interpreter start-up); its JSON form."""
    from shardport.registry.housekeeping import fsck as run_fsck
    from shardport.registry.session import Session

    return run_fsck(Session.open(store)).to_json()


def expire_and_collect(store: str) -> dict[str, Any]:
    """``gc`` as it runs once every lease of a killed command has expired (clock moved past them)."""
    from shardport.registry.housekeeping import gc
    from shardport.registry.push import LEASE_TIME
    from shardport.registry.session import Session

    session = Session.open(store)
    now = session.clock()
    session.clock = lambda: now + LEASE_TIME + timedelta(minutes=1)
    return gc(session, grace=timedelta(0)).to_json()


def assert_clean(store: str, what: object) -> dict[str, Any]:
    """fsck finds nothing wrong (stale upload folders are the documented harmless leftover)."""
    report = fsck(store)
    assert report["ok"], (what, report)
    return report


def tag_state(store: str, ref: str) -> list[tuple[int, str]]:
    """(version, target) of every version of ``ref``, verified (``log`` refuses a broken chain)."""
    code, out = run(store, "log", ref)
    if code == 3:
        return []
    assert code == 0, (ref, out)
    return [(e["version"], e["target"]) for e in out]


def log_in_process(store: str, ref: str) -> list[tuple[int, str]]:
    """``tag_state`` without a subprocess."""
    from shardport.registry.artifact.refs import parse_ref
    from shardport.registry.commands import log
    from shardport.registry.errors import NotFoundError
    from shardport.registry.session import Session

    try:
        return [
            (e["version"], e["target"]) for e in log(Session.open(store), parse_ref(ref, require_tag=True))
        ]
    except NotFoundError:
        return []


@dataclass
class Tally:
    """Figures of a kill campaign, per operation."""

    kills: dict[str, int] = field(default_factory=dict)
    landed: dict[str, int] = field(default_factory=dict)
    mid_write: dict[str, int] = field(default_factory=dict)
    fsck_clean: dict[str, int] = field(default_factory=dict)
    rerun_ok: dict[str, int] = field(default_factory=dict)

    def add(self, op: str, *, landed: bool, mid_write: bool, clean: bool, rerun: bool) -> None:
        for table, flag in (
            (self.kills, True),
            (self.landed, landed),
            (self.mid_write, mid_write),
            (self.fsck_clean, clean),
            (self.rerun_ok, rerun),
        ):
            table[op] = table.get(op, 0) + int(flag)

    def to_json(self) -> dict[str, Any]:
        total = sum(self.kills.values())
        return {
            "kills": total,
            "landed": sum(self.landed.values()),
            "landed_mid_write": sum(self.mid_write.values()),
            "fsck_clean_rate": sum(self.fsck_clean.values()) / total if total else None,
            "rerun_completed_rate": sum(self.rerun_ok.values()) / total if total else None,
            "by_operation": {
                op: {
                    "kills": n,
                    "landed": self.landed[op],
                    "landed_mid_write": self.mid_write[op],
                    "fsck_clean": self.fsck_clean[op],
                    "rerun_completed": self.rerun_ok[op],
                }
                for op, n in sorted(self.kills.items())
            },
        }


def store_keys(store: str) -> set[str]:
    """Every object key in the store (to tell whether a killed command had written anything)."""
    from shardport.registry.session import Session

    store_ = Session.open(store).store
    return {o.key for top in ("blobs", "repos", "uploads") for o in store_.walk(top)}


def jitter(rng: random.Random, writes_from: float, duration: float) -> float:
    """A kill delay: uniform from a little before the command's first write step to the end of its
    unkilled run (with some slack: run times vary on a loaded machine)."""
    start = max(0.0, writes_from - 0.15)
    return rng.uniform(start, max(duration, writes_from) + 0.3)


OPS = ("push", "convert", "tag", "rollback", "gc")
REPO, LLAMA = "crash/m", "crash/llama"


@dataclass
class Bench:
    """A store prepared for a kill campaign: two pushed versions, a convert source, calibrated delays."""

    store: str
    work: Path
    reference: str  # a local store where the same commands run unkilled (the digests to expect)
    a: str = ""
    b: str = ""
    converted: str = ""
    durations: dict[str, float] = field(default_factory=dict)
    writes_from: dict[str, float] = field(default_factory=dict)  # seconds into a run its first write step
    trials: int = 0


def _reference_push(bench: Bench, src: Path, ref: str) -> str:
    from llama_artifacts import ok as in_process

    return str(in_process(bench.reference, "push", src, ref)["digest"])


def prepare(store: str, work: Path, *, size: int = 400_000, convert: bool = True) -> Bench:
    """keygen (caller's $SHARDPORT_HOME), push A and B, tag history for rollback, a convert source
    (``convert``: else the campaign must not draw convert)."""
    from bringup_artifacts import gptq_tiny
    from llama_artifacts import ok as in_process
    from support import make_checkpoint

    bench = Bench(store=store, work=work, reference=str(work / "reference-store"))
    ok(store, "keygen")
    a_src = make_checkpoint(work / "a", seed=1, size=size)
    b_src = make_checkpoint(work / "b", seed=2, size=size)
    bench.a = str(ok(store, "push", a_src, f"{REPO}:prod")["digest"])
    bench.durations["push"], pushed = timed(store, "push", b_src, f"{REPO}:prod")
    bench.b = str(pushed["digest"])
    ok(store, "tag", f"{REPO}@{bench.a}", f"{REPO}:rb")
    bench.durations["tag"], _ = timed(store, "tag", f"{REPO}@{bench.b}", f"{REPO}:rb")
    bench.durations["rollback"], _ = timed(store, "rollback", f"{REPO}:rb", "--to", bench.a)
    ok(store, "tag", f"{REPO}@{bench.a}", f"{REPO}:moving")
    bench.durations["gc"], _ = timed(store, "gc", "--grace-seconds", "0")
    # where each command starts writing: kill delays are drawn from there to its end, so that most
    # kills land while it writes (start-up, hashing and verifying write nothing)
    calibrate = make_checkpoint(work / "calibrate", seed=3, size=size)
    for op, args, fp in (
        ("push", ["push", calibrate, f"{REPO}:calibrate"], "blob-written"),
        ("tag", ["tag", f"{REPO}@{bench.a}", f"{REPO}:calibrate"], "tagdoc-blob-written"),
        ("rollback", ["rollback", f"{REPO}:rb", "--to", bench.b], "tagdoc-blob-written"),
        ("gc", ["gc", "--grace-seconds", "0"], "gc-marked"),
    ):
        bench.writes_from[op], _ = first_write(store, args, fp, work)
    if not convert:
        return bench
    ok(store, "push", gptq_tiny(work / "llama"), f"{LLAMA}:q4")
    in_process(bench.reference, "push", work / "llama", f"{LLAMA}:q4")
    bench.converted = str(in_process(bench.reference, "convert", f"{LLAMA}:q4", f"{LLAMA}:tiled")["digest"])
    bench.durations["convert"], conv = timed(store, "convert", f"{LLAMA}:q4", f"{LLAMA}:tiled")
    assert conv["digest"] == bench.converted, (conv, bench.converted)
    bench.writes_from["convert"], _ = first_write(
        store, ["convert", f"{LLAMA}:q4", f"{LLAMA}:calibrate"], "blobs-done", work
    )
    return bench


def _garbage(bench: Bench, n: int) -> None:
    """Unreferenced content for gc to collect: a push killed before its tag, its lease expired."""
    from support import make_checkpoint

    from shardport.registry.session import Session

    src = make_checkpoint(bench.work / f"garbage{n}", seed=90_000 + n, size=200_000)
    killed = run(bench.store, "push", src, f"{REPO}:never", env={"SHARDPORT_FAILPOINT": "signature-written"})
    assert killed[0] == -signal.SIGKILL, killed
    store = Session.open(bench.store).store
    for folder in store.listdir("uploads"):  # what the clock passing LEASE_TIME does
        store.delete_tree(f"uploads/{folder}")


def _command(bench: Bench, op: str, n: int) -> tuple[list[str | Path], str | None]:
    """The command of trial ``n`` and the tag head it must leave (None: gc, whose check is fsck)."""
    from support import make_checkpoint

    if op == "push":
        src = make_checkpoint(bench.work / f"push{n}", seed=10_000 + n, size=400_000)
        return ["push", src, f"{REPO}:pushed"], _reference_push(bench, src, f"{REPO}:pushed")
    if op == "convert":  # a new tag each time: the re-run of a finished convert adds no version
        return ["convert", f"{LLAMA}:q4", f"{LLAMA}:tiled{n}"], bench.converted
    if op == "tag":
        head = log_in_process(bench.store, f"{REPO}:moving")[-1][1]
        target = bench.b if head == bench.a else bench.a
        return ["tag", f"{REPO}@{target}", f"{REPO}:moving"], target
    if op == "rollback":
        head = log_in_process(bench.store, f"{REPO}:rb")[-1][1]
        target = bench.b if head == bench.a else bench.a
        return ["rollback", f"{REPO}:rb", "--to", target, "--reason", f"kill {n}"], target
    _garbage(bench, n)
    return ["gc", "--grace-seconds", "0"], None


def _ref_of(args: list[str | Path]) -> str:
    return str(args[2] if args[0] in ("push", "convert", "tag") else args[1])


def trial(bench: Bench, op: str, rng: random.Random, tally: Tally, *, failpoint: str | None = None) -> None:
    """Kill one ``op`` (randomly in time, or at ``failpoint``); check fsck; re-run; check the outcome."""
    n = bench.trials
    bench.trials += 1
    args, expect = _command(bench, op, n)
    ref = _ref_of(args) if expect is not None else None
    before_keys = store_keys(bench.store)
    before = log_in_process(bench.store, ref) if ref else []
    if failpoint is None:
        killed = kill_after(bench.store, args, jitter(rng, bench.writes_from[op], bench.durations[op]))
    else:
        killed = kill_after(bench.store, args, 300, env={"SHARDPORT_FAILPOINT": failpoint})
        assert killed.landed, (op, failpoint, killed.output)
    assert killed.landed or killed.returncode == 0, (op, killed)
    mid_write = killed.landed and store_keys(bench.store) != before_keys
    report = fsck(bench.store)
    clean = bool(report["ok"])
    assert clean, (op, failpoint, killed.delay, report)
    code, out = run(bench.store, *args)
    if op == "rollback" and code == 2:  # the killed run had finished: the tag is already there
        assert "already points at" in out["error"]["message"], out
    else:
        assert code == 0, (op, failpoint, killed.delay, out)
    if expect is not None:
        if op in ("push", "convert"):
            assert out["digest"] == expect, (op, out, expect)
        after = log_in_process(bench.store, str(ref))
        assert after[-1][1] == expect, (op, after, expect)
        assert after[: len(before)] == before, (op, before, after)  # nothing rewritten
        grew = len(after) - len(before)
        # push/convert/rollback: at most one new version (a re-run of a finished one adds none);
        # tag always writes a version, so the killed one and the re-run may both have
        assert grew in ((0, 1, 2) if op == "tag" else (0, 1)), (op, before, after)
        assert grew >= 1 or before[-1][1] == expect
    final = fsck(bench.store)
    assert final["ok"], (op, failpoint, killed.delay, final)
    tally.add(op, landed=killed.landed, mid_write=mid_write, clean=clean, rerun=True)


def final_audit(bench: Bench) -> dict[str, Any]:
    """After a campaign: gc (leases expired) leaves fsck clean with no stale uploads; heads still pull."""
    collected = expire_and_collect(bench.store)
    report = fsck(bench.store)
    assert report["ok"] and not report["stale_uploads"], report
    for ref in (
        f"{REPO}:prod",
        f"{REPO}:moving",
        f"{REPO}:rb",
        *([f"{LLAMA}:tiled"] if bench.converted else []),
    ):
        assert ok(bench.store, "verify", ref)["ok"], ref
    return {
        "gc_removed_blobs": len(collected["removed_blobs"]),
        "gc_removed_uploads": len(collected["removed_uploads"]),
    }


RACE = "race/m:hot"


def race(store: str, work: Path, *, writers: int = 16, grace: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """``writers`` pushes to one tag at once while ``gc --grace-seconds grace`` runs in a loop.

    Every writer pushes its own checkpoint; all share the config and tokenizer blobs, and half of
    each writer's shards are already in the store as garbage (a killed push whose lease expired), so
    the pushes reuse blobs that a concurrent gc is about to collect. Returns the figures; the caller
    asserts on them.
    """
    import threading

    from support import make_checkpoint

    from shardport.registry.session import Session

    started = time.monotonic()
    srcs = [
        make_checkpoint(work / f"writer{i}", seed=seed * 1000 + i, size=50_000, files=2)
        for i in range(writers)
    ]
    garbage = work / "garbage"  # half the writers' shards, pushed by a push killed before its manifest
    garbage.mkdir(parents=True)
    for i, src in enumerate(srcs[: writers // 2]):
        for f in src.glob("model-*.bin"):
            (garbage / f"w{i}-{f.name}").write_bytes(f.read_bytes())
    code, out = run(store, "push", garbage, "race/m:garbage", env={"SHARDPORT_FAILPOINT": "blobs-done"})
    assert code == -signal.SIGKILL, out
    session = Session.open(store)
    for folder in session.store.listdir("uploads"):
        session.store.delete_tree(f"uploads/{folder}")
    prepared = time.monotonic()
    stop = threading.Event()
    gc_runs: list[tuple[int, Any]] = []

    def collect() -> None:
        while not stop.is_set():
            gc_runs.append(run(store, "gc", "--grace-seconds", str(grace)))

    collector = threading.Thread(target=collect)
    collector.start()
    procs = [
        subprocess.Popen(
            argv(store, "push", src, RACE, "--retry", str(4 * writers)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for src in srcs
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        results.append((p.returncode, out, err))
    raced = time.monotonic()
    stop.set()
    collector.join()
    gc_runs.append(run(store, "gc", "--grace-seconds", str(grace)))  # once more after the writers
    told = []
    failed = []
    for (code, out, err), src in zip(results, srcs, strict=True):
        if code != 0:
            failed.append((str(src), code, out[-500:], err[-500:]))
            continue
        doc = json.loads(out)
        told.append((int(doc["version"]), str(doc["digest"])))
    chain = log_in_process(store, RACE)
    in_chain = set(chain)
    report = fsck(store)
    unreadable = []
    from llama_artifacts import cli as in_process

    # fsck has hashed every blob and found every version's files; verify REF checks one end to end
    for _, digest in sorted(told)[-1:]:
        code, out = in_process(store, "verify", f"race/m@{digest}")
        if code != 0:
            unreadable.append((digest, out))
    return {
        "writers": writers,
        "grace_seconds": grace,
        "seconds": {"prepare": round(prepared - started, 2), "race": round(raced - prepared, 2)},
        "gc_runs": len(gc_runs),
        "gc_failures": [r for r in gc_runs if r[0] != 0],
        "failed_writers": failed,
        "versions_told": sorted(v for v, _ in told),
        "chain_versions": [v for v, _ in chain],
        "lost_updates": len([t for t in told if t not in in_chain]),
        "duplicate_versions": len(told) - len({v for v, _ in told}),
        "fsck_ok": report["ok"],
        "fsck": {k: report[k] for k in ("corrupt", "dangling", "broken_tags", "unsigned") if report[k]},
        "unverifiable_pushes": unreadable,
    }
