"""A ``registry up`` run as a user runs it (a subprocess with its own embedded Ray head), watched from
outside: its process tree, the sockets they listen on, its private folder; and the checks that it left
nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REGISTRY = [sys.executable, "-m", "shardport.cli"]


def clean_env(home: Path, tmp: Path, *, noted: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: no Ray settings of the tests', a HOME of its own.

    ``noted``: the user has seen ``registry up``'s one-time note on the cluster token (so that stderr
    holds only what the run itself says).
    """
    if noted:
        (home / "notes").mkdir(parents=True, exist_ok=True)
        (home / "notes" / "ray-token").touch()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SHARDPORT_RAY", "SHARDPORT_FAIL"))
    }
    (tmp / "user").mkdir(exist_ok=True)
    env.update(SHARDPORT_HOME=str(home), HOME=str(tmp / "user"), **extra)
    return env


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree(pid: int) -> set[int]:
    """``pid`` and every process under it."""
    try:
        return {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def listening(pids: set[int]) -> set[tuple[str, str, int]]:
    """(local address, process name, pid) of every listening TCP or UDP socket of ``pids``."""
    out = subprocess.run(["ss", "-Hlntup"], capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        for part in fields[-1].split("),("):
            if "pid=" not in part:
                continue
            pid = int(part.split("pid=")[1].split(",")[0])
            if pid in pids:
                found.add((fields[4], part.split('"')[1], pid))
    return found


def owned_folders(pid: int) -> list[Path]:
    """The ``/tmp/sp-ray-*`` folders whose recorded owner is ``pid``."""
    out = []
    for folder in Path("/tmp").glob("sp-ray-*"):
        try:
            if (folder / "owner.pid").read_text().split()[0] == str(pid):
                out.append(folder)
        except (OSError, IndexError):
            continue
    return out


@dataclass
class Watched:
    """A finished ``registry up``: exit status, output, and what was seen while it ran."""

    code: int
    out: str
    err: str
    pid: int
    pids: set[int] = field(default_factory=set)
    sockets: set[tuple[str, str, int]] = field(default_factory=set)
    folders: set[Path] = field(default_factory=set)

    def ranks(self) -> set[int]:
        """The pids of the rank processes seen."""
        return {pid for _, name, pid in self.sockets if "RankActor" in name}

    def leaks(self, wait: float = 20.0) -> list[str]:
        """What is left: processes of its tree, its private folders (waits up to ``wait`` s for them)."""
        deadline = time.monotonic() + wait
        while True:
            left = [f"process {p}" for p in sorted(self.pids) if running(p)]
            left += [f"folder {f}" for f in sorted(self.folders | set(owned_folders(self.pid))) if f.exists()]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.3)


def watch_up(
    argv: list[str],
    env: dict[str, str],
    *,
    act: Callable[[subprocess.Popen[str], set[int], set[tuple[str, str, int]]], None] | None = None,
    timeout: float = 300.0,
) -> Watched:
    """Run ``registry ARGV`` and watch it until it exits; ``act(proc, pids, sockets)`` is called on every
    look (to send it a signal once its ranks are up, say)."""
    proc = subprocess.Popen(
        [*REGISTRY, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = Watched(0, "", "", proc.pid)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        pids = tree(proc.pid)
        seen.pids |= pids - {proc.pid}
        seen.sockets |= listening(pids)
        seen.folders |= set(owned_folders(proc.pid))
        if act is not None:
            act(proc, pids, seen.sockets)
        time.sleep(0.1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    seen.out, seen.err = proc.communicate()
    seen.code = proc.returncode
    return seen


def partial_files(*roots: Path) -> list[Path]:
    """``*.partial`` files (half-written outputs) under ``roots``."""
    return [p for root in roots for p in root.rglob("*.partial")]
