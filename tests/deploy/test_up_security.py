"""The embedded Ray head of ``registry up``: loopback only, token authentication on, private files, quiet.

One real CLI bring-up (``registry up --tp 2``, a subprocess with a fresh environment: no loopback switch,
no RAY_AUTH_MODE, a HOME of its own) is watched from outside: every listening socket of its processes
(the driver and everything under it: GCS, raylet, agents, rank actors) is read with ``ss`` while it runs.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from bringup_artifacts import gptq_tiny
from llama_artifacts import ok

from shardport.deploy import cluster_auth, scratch
from shardport.deploy.errors import ClusterSettingsError

REGISTRY = [sys.executable, "-m", "shardport.cli"]


def _env(home: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SHARDPORT_RAY"))}
    env.update(SHARDPORT_HOME=str(home), HOME=str(tmp / "user"), **extra)
    (tmp / "user").mkdir(exist_ok=True)
    return env


def _tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _listening(pids: set[int]) -> set[tuple[str, str]]:
    """(local address, process) of every listening TCP/UDP socket of ``pids``."""
    out = subprocess.run(["ss", "-Hlntup"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        owners = [p for p in pids if f"pid={p}," in line]
        if owners:
            fields = line.split()
            found.add((fields[4], fields[-1][:60]))
    return found


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or host.startswith("::ffff:127.")


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_head_listens_on_loopback_only_and_keeps_quiet(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    argv = [*REGISTRY, "--store", store, "--json", "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300"]
    argv += ["--generate", "2", "--ladder", "off", "--no-evidence"]
    before = set(Path("/tmp").glob("sp-ray-*"))
    proc = subprocess.Popen(
        argv, env=_env(home, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: set[tuple[str, str]] = set()
    ranks: set[str] = set()
    folders: dict[Path, int] = {}
    while proc.poll() is None:
        pids = _tree(proc.pid)
        sockets = _listening(pids)
        seen |= sockets
        ranks |= {who.split("pid=")[1].split(",")[0] for _, who in sockets if "RankActor" in who}
        for folder in set(Path("/tmp").glob("sp-ray-*")) - before:
            if scratch.owner_alive(folder) and (folder / scratch.OWNER).read_text().split()[0] == str(proc.pid):
                folders[folder] = stat.S_IMODE(folder.stat().st_mode)
                token = folder / cluster_auth.TOKEN_FILE
                if token.exists():
                    folders[token] = stat.S_IMODE(token.stat().st_mode)
        time.sleep(0.1)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["passed"]
    assert len(ranks) == 2, seen  # both rank processes were seen listening (Ray's RPC server, gloo's)
    exposed = sorted(s for s in seen if not _loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"
    processes = {who.split('"')[1] for _, who in seen}
    assert {"gcs_server", "raylet"} <= processes, processes
    # its private folder was 0700 and the cluster token in it 0600; both gone with the bring-up
    assert folders and all(mode == 0o700 for f, mode in folders.items() if f.name.startswith("sp-ray-"))
    assert [mode for f, mode in folders.items() if f.name == cluster_auth.TOKEN_FILE] == [0o600]
    assert not any(f.exists() for f in folders)
    assert not (tmp_path / "user" / ".ray").exists()  # nothing of Ray's under the home directory
    # no Ray log line on stderr (Ray's lines carry "INFO"/"WARNING" with a source file, or "(raylet)")
    ray_lines = [line for line in err.splitlines() if ".py:" in line or ".cc:" in line or "(raylet)" in line]
    assert not ray_lines and "Ray" not in err, err


def test_an_embedded_head_without_authentication_is_refused_unless_asked_for() -> None:
    assert cluster_auth.auth_mode({}) == "token"
    assert cluster_auth.auth_mode({"RAY_AUTH_MODE": "token"}) == "token"
    with pytest.raises(ClusterSettingsError, match=r"RAY_AUTH_MODE='disabled'.*SHARDPORT_RAY_AUTH=disabled"):
        cluster_auth.auth_mode({"RAY_AUTH_MODE": "disabled"})
    assert cluster_auth.auth_mode({"RAY_AUTH_MODE": "disabled", "SHARDPORT_RAY_AUTH": "disabled"}) == "disabled"
    with pytest.raises(ClusterSettingsError, match=r"SHARDPORT_RAY_AUTH='off': expected token"):
        cluster_auth.auth_mode({"SHARDPORT_RAY_AUTH": "off"})


def test_the_cli_refuses_an_unauthenticated_embedded_head(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    argv = [*REGISTRY, "--store", store, "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5"]
    before = set(Path("/tmp").glob("sp-ray-*"))
    done = subprocess.run(
        argv, env=_env(home, tmp_path, RAY_AUTH_MODE="disabled"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "keeps token authentication on" in done.stderr and "SHARDPORT_RAY_AUTH=disabled" in done.stderr
    assert not [f for f in set(Path("/tmp").glob("sp-ray-*")) - before if not scratch.owner_alive(f)]
