"""fsck finds corrupt and dangling objects; gc honours leases of pushes in flight."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.errors import StateFileError
from shardport.registry.housekeeping import fsck, gc
from shardport.registry.progress import Quiet, reporter
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key, tag_key
from shardport.registry.trust.tags import format_time


@pytest.fixture
def pushed(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> tuple[Cli, Session, str]:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    digest = cli.ok("push", make_checkpoint(tmp_path / "c"), "a/m:t")["digest"]
    return cli, Session.open(cli.store), digest


def test_fsck_reports_corrupt_blob(pushed: tuple[Cli, Session, str]) -> None:
    cli, session, digest = pushed
    f = Manifest.from_bytes(session.store.read_blob(digest)).files[0]
    raw = bytearray(session.store.read(blob_key(f.digest)))
    raw[0] ^= 0xFF
    session.store.put(blob_key(f.digest), bytes(raw))
    code, out = cli("fsck")
    assert code == 1 and len(out["corrupt"]) == 1 and f.digest in out["corrupt"][0]


def test_fsck_reports_dangling_and_broken(pushed: tuple[Cli, Session, str]) -> None:
    _, session, digest = pushed
    f = Manifest.from_bytes(session.store.read_blob(digest)).files[-1]
    session.store.delete(blob_key(f.digest))
    report = fsck(session)
    assert not report.ok and any(f.path in d for d in report.dangling)
    session.store.put(tag_key("a/m", "t", 1), b"not an envelope")
    report = fsck(session)
    assert report.broken_tags and "a/m:t" in report.broken_tags[0]


def test_gc_keeps_blobs_named_by_a_live_lease(pushed: tuple[Cli, Session, str]) -> None:
    _, session, _ = pushed
    in_flight = session.store.put_blob(b"a blob a concurrent push is about to reference")
    expired = session.store.put_blob(b"a blob of a push that died long ago")
    now = session.clock()
    session.store.put(
        "uploads/live/lease.json",
        json.dumps({"expires": format_time(now + timedelta(hours=1)), "digests": [in_flight]}).encode(),
    )
    session.store.put(
        "uploads/dead/lease.json",
        json.dumps({"expires": format_time(now - timedelta(hours=1)), "digests": [expired]}).encode(),
    )
    report = gc(session, grace=timedelta(0))
    assert report.removed_blobs == [expired]
    assert session.store.has_blob(in_flight) and not session.store.has_blob(expired)
    assert report.removed_uploads == ["uploads/dead"]
    assert session.store.exists("uploads/live/lease.json")
    assert fsck(session).ok


def test_gc_leaves_the_files_of_a_leased_work_folder_alone(pushed: tuple[Cli, Session, str]) -> None:
    _, session, _ = pushed
    now = session.clock()
    lease = {"expires": format_time(now + timedelta(hours=1)), "digests": []}
    session.store.put("uploads/convert-x/lease.json", json.dumps(lease).encode())
    session.store.put("uploads/convert-x/out/model.safetensors.sptiled", b"a tile being written")
    session.store.put("uploads/tmp/orphan", b"left by a crashed upload")
    report = gc(session, grace=timedelta(0))  # every file is older than the grace window
    assert report.removed_uploads == ["uploads/tmp/orphan"]
    assert session.store.exists("uploads/convert-x/out/model.safetensors.sptiled")
    expired = {"expires": format_time(now - timedelta(seconds=1)), "digests": []}
    session.store.put("uploads/convert-x/lease.json", json.dumps(expired).encode())
    report = gc(session, grace=timedelta(0))
    assert "uploads/convert-x" in report.removed_uploads
    assert not session.store.walk("uploads/convert-x")


def test_progress_is_quiet_off_a_terminal() -> None:
    with reporter(json_mode=False) as rep:  # pytest's stderr is not a TTY
        assert isinstance(rep, Quiet)
    with reporter(json_mode=True) as rep:
        assert isinstance(rep, Quiet)


def test_progress_bars_on_a_terminal(tmp_path: Path, home: Path) -> None:
    import os
    import pty
    import subprocess

    from support import REGISTRY

    ck = make_checkpoint(tmp_path / "c", size=3_000_000)
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    subprocess.run(
        [REGISTRY, "--store", str(tmp_path / "s"), "keygen"], check=True, capture_output=True, env=env
    )
    for json_flag, expect in ((["--json"], False), ([], True)):
        master, slave = pty.openpty()
        proc = subprocess.run(
            [REGISTRY, "--store", str(tmp_path / "s"), *json_flag, "push", str(ck), f"a/p:{int(expect)}"],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=env,
            check=True,
            timeout=120,
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        os.close(master)
        assert (b"hashing" in seen or b"uploading" in seen) is expect, seen[:300]
        assert proc.stdout


def test_a_file_in_blobs_that_is_not_a_blob_name(pushed: tuple[Cli, Session, str]) -> None:
    """fsck reports it, gc leaves it alone (not ours), and neither builds a key from it."""
    _, session, _ = pushed
    session.store.put("blobs/sha256/notes.txt", b"someone's file")
    report = fsck(session)
    assert any("blobs/sha256/notes.txt: not a blob name" in c for c in report.corrupt), report.corrupt
    gc(session, grace=timedelta(0))
    assert session.store.read("blobs/sha256/notes.txt") == b"someone's file"


def test_malformed_digests_in_leases_and_client_state(pushed: tuple[Cli, Session, str]) -> None:
    _, session, _ = pushed
    session.store.put(
        "uploads/odd/lease.json",
        json.dumps(
            {"expires": format_time(session.clock() + timedelta(hours=1)), "digests": ["sha256:../../x", 7]}
        ).encode(),
    )
    gc(session, grace=timedelta(0))  # a malformed lease names nothing and breaks nothing
    state = json.loads(session.state.path.read_text())
    state["tags"]["a/m:t"]["digest"] = "sha256:../../x"
    session.state.path.write_text(json.dumps(state))
    with pytest.raises(StateFileError, match=r"client state .*a/m:t.*'sha256:\.\./\.\./x'"):
        session.state.get("a/m", "t")


def test_an_empty_attachment_folder_is_not_dangling(pushed: tuple[Cli, Session, str], tmp_path: Path) -> None:
    """SeaweedFS keeps listing, for a while, the folder gc's delete left; it attaches nothing."""
    _, session, _ = pushed
    assert session.store.local_root is not None
    missing = "0" * 64
    (session.store.local_root / "repos/a/m/referrers" / missing).mkdir(parents=True)
    assert fsck(session).ok, fsck(session)
    session.store.put(f"repos/a/m/referrers/{missing}/{'1' * 64}", b"{}")  # a link in it: reported
    assert any(f"sha256:{missing}, which is missing" in d for d in fsck(session).dangling)
