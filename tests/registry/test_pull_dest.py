"""What a full pull may replace: never a user's files, the root, home, current folder or the store.

Each case is the one a user hit (issue 15): ``registry pull REF v`` deleted ``v/thesis.tex``, ``pull REF .``
emptied the working folder, ``pull REF /`` raised a traceback, and a pull stopped with SIGTERM left
its ``.DEST.pull-*`` folder behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import REGISTRY, Cli, make_checkpoint

from shardport.registry.output.staging import temp_name

REF = "m/x:1"


@pytest.fixture
def cli(tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    cli.ok("push", make_checkpoint(tmp_path / "v1", seed=1, size=20_000), REF)
    cli.ok("push", make_checkpoint(tmp_path / "v2", seed=2, size=20_000), "m/x:2")
    return cli


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (not following links): file bytes, link targets, folders."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[key] = "dir"
        else:
            out[key] = path.read_bytes()
    return out


def temporaries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".pull-" in p.name)


def refused(cli: Cli, *args: str | Path, text: str) -> str:
    code, out = cli("pull", *args)
    assert code == 2, out
    assert out["error"]["type"] == "UsageError", out
    assert text in out["error"]["message"], out
    return str(out["error"]["message"])


def test_folder_with_a_users_file_is_refused(cli: Cli, tmp_path: Path) -> None:
    v = tmp_path / "v"
    v.mkdir()
    (v / "thesis.tex").write_text("important")
    message = refused(cli, REF, v, text="is not empty (1 entry: thesis.tex)")
    assert str(v) in message and "--force" in message
    assert snapshot(v) == {"thesis.tex": b"important"}
    assert temporaries(tmp_path) == []


def test_root_home_current_folder_and_store_are_refused_even_with_force(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    work = tmp_path / "work" / "project"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    user_home = tmp_path / "user"
    user_home.mkdir()
    (user_home / ".bashrc").write_text("mine")
    monkeypatch.setenv("HOME", str(user_home))
    before = snapshot(tmp_path / "work"), snapshot(user_home), snapshot(tmp_path / "store")
    for force in ([], ["--force"]):
        refused(cli, REF, "/", *force, text="is the file system root")
        refused(cli, REF, ".", *force, text=f"is the current folder ({work})")
        refused(cli, REF, "..", *force, text="contains the current folder")
        refused(cli, REF, "./sub/../..", *force, text="contains the current folder")
        refused(cli, REF, user_home, *force, text="is your home folder")
        refused(cli, REF, tmp_path / "store", *force, text="is the store")
        refused(cli, REF, tmp_path / "store" / "repos" / "x", *force, text="is inside the store")
        refused(cli, REF, home, *force, text="is shardport's home folder")
    assert (snapshot(tmp_path / "work"), snapshot(user_home), snapshot(tmp_path / "store")) == before
    assert not (tmp_path / "store" / "repos" / "x").exists() and not (work / "sub").exists()
    assert temporaries(work) == temporaries(tmp_path) == temporaries(Path("/")) == []


def test_link_and_file_are_refused_even_with_force(cli: Cli, tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    cli.ok("pull", REF, pulled)
    link = tmp_path / "link"
    link.symlink_to(pulled)
    file = tmp_path / "file"
    file.write_text("mine")
    before = snapshot(pulled)
    for force in ([], ["--force"]):
        refused(cli, REF, link, *force, text="is a symbolic link")
        refused(cli, REF, file, *force, text="exists and is not a folder")
    assert link.is_symlink() and snapshot(pulled) == before and file.read_text() == "mine"
    assert temporaries(tmp_path) == []


def test_empty_folder_and_earlier_pull_are_replaced(cli: Cli, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    dest.mkdir()
    one = cli.ok("pull", REF, dest)
    assert one["dest"] == str(dest) and (dest / ".shardport" / "ref.json").is_file()
    two = cli.ok("pull", "m/x:2", dest)  # over our own earlier pull: replaced
    assert two["digest"] != one["digest"]
    assert (dest / "model-00000.bin").read_bytes() == (tmp_path / "v2" / "model-00000.bin").read_bytes()
    # an earlier pull that also holds a file of the user's is not ours alone any more
    (dest / "eval.txt").write_text("my results")
    refused(cli, REF, dest, text="earlier pull but also holds what pull did not write (1 entry: eval.txt)")
    (dest / "eval.txt").unlink()
    (dest / "model-00000.bin").unlink()
    (dest / "model-00000.bin").symlink_to(tmp_path / "v1" / "config.json")  # a link pull never wrote
    refused(cli, REF, dest, text="(1 entry: model-00000.bin)")
    (dest / ".shardport" / "ref.json").unlink()  # no longer recognisably ours
    refused(cli, REF, dest, text="is not an earlier pull (no .shardport/ref.json)")
    assert (tmp_path / "v1" / "config.json").read_text().startswith("{")
    assert temporaries(tmp_path) == []


def test_force_replaces_a_folder(cli: Cli, tmp_path: Path) -> None:
    v = tmp_path / "v"
    v.mkdir()
    (v / "thesis.tex").write_text("important")
    out = cli.ok("pull", REF, v, "--force")
    assert out["dest"] == str(v)
    pulled = {k: data for k, data in snapshot(v).items() if not k.startswith(".shardport")}
    assert pulled == snapshot(tmp_path / "v1")  # thesis.tex is gone: --force replaces DEST as a whole
    assert temporaries(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_stale_temporary_folders_of_dead_pulls_are_removed(cli: Cli, tmp_path: Path) -> None:
    killed = subprocess.run(
        [REGISTRY, "--store", cli.store, "--json", "pull", REF, str(tmp_path / "v")],
        env={**os.environ, "SHARDPORT_FAILPOINT": "pull-file-fetched"},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    (left,) = temporaries(tmp_path)  # SIGKILL cannot be caught: its folder stays ...
    assert left.startswith(".v.pull-")
    mine = re.sub(r"-[0-9]+-([0-9a-f]{12})$", rf"-{os.getpid()}-\1", temp_name("v", "pull"))
    (tmp_path / mine).mkdir()  # ... and a pull of a live process (this one) must be left alone
    dead = re.sub(r"-[0-9]+-([0-9a-f]{12})$", rf"-{_dead_pid()}-\1", temp_name("w", "pull"))
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("mine")
    (tmp_path / dead).symlink_to(target)  # a link with a stale name is neither followed nor removed
    other_host = f".w.pull-00000000-{_dead_pid()}-{'0' * 12}"
    (tmp_path / other_host).mkdir()  # another host's (shared file system): its pid means nothing here
    cli.ok("pull", REF, tmp_path / "v")
    assert temporaries(tmp_path) == sorted([mine, dead, other_host])
    assert (target / "keep").read_text() == "mine"


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_download_removes_the_temporary_folder(
    cli: Cli, tmp_path: Path, sig: signal.Signals
) -> None:
    dest = tmp_path / "d"
    cli.ok("pull", REF, dest)
    before = snapshot(dest)
    proc = subprocess.Popen(
        [REGISTRY, "--store", cli.store, "--json", "pull", "m/x:2", str(dest)],
        env={**os.environ, "SHARDPORT_FAILPOINT": "pull-file-fetched:pause"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,  # a test run in the background may have SIGINT ignored
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.iterdir() for p in tmp_path.glob(".d.pull-*")):  # files are arriving
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -sig, err
    left = {t: sorted(snapshot(tmp_path / t)) for t in temporaries(tmp_path)}
    assert left == {}, err.decode()
    assert snapshot(dest) == before
