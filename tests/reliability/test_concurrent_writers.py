"""16 concurrent ``registry push`` writers to one tag, with ``gc --grace-seconds 0`` looping beside them.

Lost updates must be 0: every version a writer was told it wrote is in the verified chain with that
writer's manifest, no two writers were told the same version, the chain has no gap, and gc never
deleted a blob a tag or an in-flight push needed (fsck clean, every pushed manifest verifies). Half
the writers reuse blobs that sit in the store unreferenced (a killed push whose lease expired), the
case where a gc that swept on a stale view would delete what a push has just decided not to upload.
The older 8-writer tag race is tests/registry/test_concurrency.py; bench/bench_reliability.py repeats
this one more times.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from crashes import ok, race


def _check(figures: dict[str, object]) -> None:
    assert not figures["failed_writers"] and not figures["gc_failures"], figures
    told = figures["versions_told"]
    assert told == figures["chain_versions"] == list(range(1, 17)), figures  # distinct, no gap
    assert figures["lost_updates"] == 0 and figures["duplicate_versions"] == 0, figures
    assert figures["fsck_ok"] and not figures["unverifiable_pushes"], figures
    assert figures["gc_runs"] >= 2, figures


@pytest.mark.slow
def test_sixteen_writers_and_gc_local(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    _check(race(store, tmp_path / "work", writers=16))


@pytest.mark.slow
@pytest.mark.s3
def test_sixteen_writers_and_gc_seaweedfs(seaweed_store_url: str, tmp_path: Path, home: Path) -> None:
    ok(seaweed_store_url, "keygen")
    _check(race(seaweed_store_url, tmp_path / "work", writers=16, seed=1))


@pytest.mark.parametrize(
    "backend", ["local", pytest.param("seaweedfs", marks=[pytest.mark.s3, pytest.mark.slow])]
)
def test_gc_paused_between_mark_and_sweep_spares_what_a_push_reused(
    backend: str, tmp_path: Path, home: Path, request: pytest.FixtureRequest
) -> None:
    """The interleaving the race above samples, forced: gc chooses a garbage manifest and its blobs,
    a push of the same files finds them present (uploads nothing) and tags them, then gc sweeps."""
    import signal
    import subprocess

    from crashes import argv, fsck, run
    from support import make_checkpoint

    from shardport.registry.session import Session

    store = str(tmp_path / "store") if backend == "local" else request.getfixturevalue("seaweed_store_url")
    ok(store, "keygen")
    src = make_checkpoint(tmp_path / "ck", seed=3)
    code, _ = run(store, "push", src, "race/m:v", env={"SHARDPORT_FAILPOINT": "signature-written"})
    assert code == -signal.SIGKILL
    session = Session.open(store)
    for folder in session.store.listdir("uploads"):  # its lease expired: all of it is garbage now
        session.store.delete_tree(f"uploads/{folder}")
    resume = tmp_path / "resume"
    env = {"SHARDPORT_FAILPOINT": "gc-marked:pause", "SHARDPORT_FAILPOINT_RESUME": str(resume)}
    gc = subprocess.Popen(
        argv(store, "gc", "--grace-seconds", "0"),
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        for _ in range(3000):
            if Path(f"{resume}.paused").exists() or gc.poll() is not None:
                break
            time.sleep(0.01)
        assert gc.poll() is None, "gc did not pause at gc-marked"
        pushed = ok(store, "push", src, "race/m:v")
        assert pushed["uploaded_bytes"] == 0 and pushed["version"] == 1, pushed  # all reused
        assert gc.poll() is None  # still paused: the push ran entirely between mark and sweep
    finally:
        resume.touch()
        out, _ = gc.communicate(timeout=60)
    assert gc.returncode == 0, out
    removed = set(json.loads(out)["removed_blobs"])
    assert pushed["digest"] not in removed, out
    report = fsck(store)
    assert report["ok"], report
    assert ok(store, "pull", "race/m:v", tmp_path / "out")["digest"] == pushed["digest"]


def test_a_push_restores_reused_blobs_a_gc_removed_before_it_tagged(tmp_path: Path, home: Path) -> None:
    """The window gc's marks cannot see: a gc that marked before this push's lease existed deletes the
    garbage blobs the push found present, before the push tags. The push checks again once tagged (its
    lease still held) and uploads what is gone, so its tag never points at a missing blob."""
    import signal
    import subprocess

    from crashes import argv, fsck, run
    from support import make_checkpoint

    from shardport.registry.session import Session
    from shardport.registry.store.keys import blob_key

    store = str(tmp_path / "store")
    ok(store, "keygen")
    src = make_checkpoint(tmp_path / "ck", seed=4)
    code, _ = run(store, "push", src, "race/r:v", env={"SHARDPORT_FAILPOINT": "signature-written"})
    assert code == -signal.SIGKILL
    session = Session.open(store)
    for folder in session.store.listdir("uploads"):  # its lease expired: its blobs are garbage now
        session.store.delete_tree(f"uploads/{folder}")
    resume = tmp_path / "resume"
    env = {"SHARDPORT_FAILPOINT": "manifest-written:pause", "SHARDPORT_FAILPOINT_RESUME": str(resume)}
    push = subprocess.Popen(
        argv(store, "push", src, "race/r:v"), stdout=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    try:
        for _ in range(3000):
            if Path(f"{resume}.paused").exists() or push.poll() is not None:
                break
            time.sleep(0.01)
        assert push.poll() is None, "the push did not pause at manifest-written"
        reused = [f"sha256:{o.key.rsplit('/', 1)[-1]}" for o in session.store.walk("blobs/sha256")]
        for digest in reused:  # what a gc that marked before the lease would sweep (the manifest too)
            session.store.delete(blob_key(digest))
    finally:
        resume.touch()
        out, _ = push.communicate(timeout=120)
    assert push.returncode == 0, out
    pushed = json.loads(out)
    assert pushed["uploaded_bytes"] == 0, pushed  # everything was found present before the sweep
    assert all(session.store.has_blob(d) for d in reused)  # the file blobs and the manifest are back
    report = fsck(store)
    assert report["ok"], report
