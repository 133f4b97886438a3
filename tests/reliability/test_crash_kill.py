"""SIGKILL of real ``registry`` processes during push, convert, tag, rollback and gc, on both backends.

Each kill is followed by ``fsck`` (must be clean: stale upload folders and unreferenced blobs are the
documented harmless leftovers), a re-run of the same command (must complete with the digest and tag
head an unkilled run gives, without rewriting history), and at the end a gc once the killed commands'
leases have expired (must leave no stale upload and every tag verifiable). Random-time kills sample
the whole run; the failpoint matrix hits every write step of every command once.
bench/bench_reliability.py runs the same campaign with hundreds of kills.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from crashes import OPS, Bench, Tally, final_audit, prepare, trial

# the write steps each command passes (registry/_failpoints.py) beyond push's, which
# tests/registry/test_concurrency.py::test_crash_at_every_write_step kills at one by one (local, moto)
FAILPOINTS = {
    "convert": ("blobs-done", "tagdoc-blob-written"),  # its other steps are push's (the same publish)
    "tag": ("tagdoc-blob-written",),
    "rollback": ("tagdoc-blob-written",),
    "gc": ("gc-blob-removed",),  # after its first deletion
}


def _campaign(store: str, tmp_path: Path, kills: int, seed: int, *, convert: bool) -> tuple[Bench, Tally]:
    bench = prepare(store, tmp_path / "work", convert=convert)
    rng = random.Random(seed)
    tally = Tally()
    ops = OPS if convert else tuple(op for op in OPS if op != "convert")
    for i in range(kills):
        trial(bench, ops[i % len(ops)], rng, tally)
    return bench, tally


@pytest.mark.slow
def test_random_kills_local(tmp_path: Path, home: Path) -> None:
    bench, tally = _campaign(str(tmp_path / "store"), tmp_path, kills=7, seed=1, convert=True)
    for op, fps in FAILPOINTS.items():
        for fp in fps:
            trial(bench, op, random.Random(0), tally, failpoint=fp)
    figures = tally.to_json()
    assert figures["fsck_clean_rate"] == 1.0 and figures["rerun_completed_rate"] == 1.0, figures
    # the delays sample the whole run: some kills must land after the command started writing
    assert figures["landed_mid_write"] >= len([fp for fps in FAILPOINTS.values() for fp in fps]), figures
    final_audit(bench)


@pytest.mark.slow
@pytest.mark.s3
def test_random_kills_seaweedfs(seaweed_store_url: str, tmp_path: Path, home: Path) -> None:
    # convert: local only in CI (the bench runs it on both)
    bench, tally = _campaign(seaweed_store_url, tmp_path, kills=4, seed=2, convert=False)
    for fp in ("blob-written",):  # S3's multipart upload, aborted
        trial(bench, "push", random.Random(0), tally, failpoint=fp)
    figures = tally.to_json()
    assert figures["fsck_clean_rate"] == 1.0 and figures["rerun_completed_rate"] == 1.0, figures
    final_audit(bench)


def test_a_rerun_of_a_finished_convert_adds_no_version(tmp_path: Path, home: Path) -> None:
    """Like push: re-running a convert (what a crashed caller does) whose tag already points at the
    result leaves the tag as it is (it used to write a second version of the same target)."""
    from bringup_artifacts import gptq_tiny
    from llama_artifacts import ok

    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "src"), "m/q:v1")
    first = ok(store, "convert", "m/q:v1", "m/q:tiled")
    again = ok(store, "convert", "m/q:v1", "m/q:tiled")
    assert (again["digest"], again["version"], again["unchanged"]) == (first["digest"], 1, True), again
    assert [e["version"] for e in ok(store, "log", "m/q:tiled")] == [1]
