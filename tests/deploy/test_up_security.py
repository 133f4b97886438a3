"""The embedded Ray head of ``registry up``: loopback only, token authentication on, private files, quiet.

One real CLI bring-up (``registry up --tp 2``, a subprocess with a fresh environment: no loopback switch,
no RAY_AUTH_MODE, a HOME of its own) is watched from outside: every listening socket of its processes
(the driver and everything under it: GCS, raylet, agents, rank actors) is read with ``ss`` while it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bringup_artifacts import gptq_tiny
from bringup_procs import REGISTRY, clean_env, watch_up
from llama_artifacts import ok

from shardport.cli.bringup import AUTH_NOTE
from shardport.deploy import cluster_auth, scratch
from shardport.deploy.errors import ClusterSettingsError


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith(("127.", "::ffff:127.")) or host == "::1"


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_head_listens_on_loopback_only_and_keeps_quiet(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    argv = ["--store", store, "--json", "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300"]
    argv += ["--generate", "2", "--ladder", "off", "--no-evidence"]
    modes: dict[str, int] = {}

    def modes_of(proc: subprocess.Popen[str], pids: set[int], sockets: set[tuple[str, str, int]]) -> None:
        for folder in Path("/tmp").glob("sp-ray-*"):
            token = folder / cluster_auth.TOKEN_FILE
            if (folder / scratch.OWNER).exists() and token.exists():
                if (folder / scratch.OWNER).read_text().split()[0] == str(proc.pid):
                    modes.update(
                        folder=stat.S_IMODE(folder.stat().st_mode), token=stat.S_IMODE(token.stat().st_mode)
                    )

    up = watch_up(argv, clean_env(home, tmp_path, noted=False), act=modes_of)
    assert up.code == 0, up.err[-3000:]
    assert json.loads(up.out)["passed"]
    assert len(up.ranks()) == 2, up.sockets  # both rank processes were seen listening (Ray's RPC, gloo)
    exposed = sorted(s for s in up.sockets if not _loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert {"gcs_server", "raylet"} <= {name for _, name, _ in up.sockets}, up.sockets
    # its private folder was 0700 and the cluster token in it 0600; nothing left, nothing under ~/.ray
    assert modes == {"folder": 0o700, "token": 0o600}, modes
    assert not up.leaks()
    assert not (tmp_path / "user" / ".ray").exists()
    # no Ray log line on stderr (Ray's carry a source file: "worker.py:2038", "gcs_client.cc:210"), only
    # our own note on the token, once per SHARDPORT_HOME
    assert up.err.splitlines() == [AUTH_NOTE], up.err
    again = watch_up(argv, clean_env(home, tmp_path, noted=False))
    assert again.code == 0 and again.err == "", again.err


def test_an_embedded_head_without_authentication_is_refused_unless_asked_for() -> None:
    assert cluster_auth.auth_mode({}) == "token"
    assert cluster_auth.auth_mode({"RAY_AUTH_MODE": "token"}) == "token"
    with pytest.raises(ClusterSettingsError, match=r"RAY_AUTH_MODE='disabled'.*SHARDPORT_RAY_AUTH=disabled"):
        cluster_auth.auth_mode({"RAY_AUTH_MODE": "disabled"})
    assert (
        cluster_auth.auth_mode({"RAY_AUTH_MODE": "disabled", "SHARDPORT_RAY_AUTH": "disabled"}) == "disabled"
    )
    with pytest.raises(ClusterSettingsError, match=r"SHARDPORT_RAY_AUTH='off': expected token"):
        cluster_auth.auth_mode({"SHARDPORT_RAY_AUTH": "off"})


def test_the_cli_refuses_an_unauthenticated_embedded_head(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    argv = ["--store", store, "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5"]
    before = set(Path("/tmp").glob("sp-ray-*"))
    env = clean_env(home, tmp_path, RAY_AUTH_MODE="disabled")
    done = subprocess.run([*REGISTRY, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "keeps token authentication on" in done.stderr and "SHARDPORT_RAY_AUTH=disabled" in done.stderr
    assert not [f for f in set(Path("/tmp").glob("sp-ray-*")) - before if not scratch.owner_alive(f)]


@pytest.mark.ray
@pytest.mark.slow
def test_address_on_loopback_is_joined_on_loopback(home: Path, tmp_path: Path) -> None:
    """``--address 127.0.0.1:P`` stays on loopback (Ray rewrote it to the external address, where a
    loopback head does not answer) and ``--verbose`` shows Ray's own lines."""
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    head = scratch.make()  # in /tmp: Ray's socket paths must stay short
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a cluster of the user's own, without a token (its own setting; not an embedded head)
    env = clean_env(home, tmp_path, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    ray_cli = str(Path(sys.executable).parent / "ray")
    start = [ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2"]
    start += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={head / 'r'}"]
    started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")  # the driver sets it itself
        argv = ["--store", store, "--json", "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300"]
        argv += ["--generate", "2", "--ladder", "off", "--no-evidence", "--address", f"127.0.0.1:{port}"]
        up = watch_up([*argv, "--verbose"], env, timeout=240)
        assert up.code == 0, up.err[-3000:]
        assert json.loads(up.out)["passed"]
        driver = {s for s in up.sockets if s[2] == up.pid}
        assert driver and all(_loopback(a) for a, _, _ in driver), driver
        assert f"Connecting to existing Ray cluster at address: 127.0.0.1:{port}" in up.err
        assert not up.leaks()  # its own private folder (the rendezvous) is gone; the head is the user's
    finally:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in scratch.holders(head):
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
            time.sleep(2)
        shutil.rmtree(head, ignore_errors=True)
