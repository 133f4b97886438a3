"""Bring-up faults, as a user meets them: ``registry up --tp 2`` (a subprocess with its own embedded Ray
head) with a rank killed (SIGKILL) or drained (SIGTERM) at a stage of its own, or the driver stopped.

Each ends cleanly: the right exit status, one message naming the rank and the stage, and nothing left
(no process of the bring-up, no ``sp-ray-*`` folder, no ``.partial`` file). A rank is hit through its
failpoint ``rank<R>-<stage>`` (``SHARDPORT_FAILPOINT``; ``:term`` sends SIGTERM). The sweep over every
stage and signal is ``bench/bench_bringup_faults.py``; these are one per stage group.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from bringup_artifacts import gptq_tiny
from bringup_procs import clean_env, owned_folders, partial_files, running, tree, watch_up
from llama_artifacts import ok

from shardport.deploy import scratch

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _pushed(tmp: Path) -> str:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp / "gptq"), "llama/gptq:v1")
    return store


def _up(store: str, *extra: str) -> list[str]:
    argv = ["--store", store, "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300", "--generate", "2"]
    return [*argv, "--no-evidence", *extra]


@pytest.mark.parametrize(
    ("failpoint", "rank", "phase"),
    [
        ("rank1-fetch:term", 1, "prepare"),  # drained while loading its tiles
        ("rank0-ladder", 0, "prepare"),  # killed in its parity ladder (after dispatch)
        ("rank1-decode:term", 1, "run"),  # drained while generating
    ],
)
def test_a_lost_rank_aborts_cleanly(
    home: Path, tmp_path: Path, failpoint: str, rank: int, phase: str
) -> None:
    store = _pushed(tmp_path)
    env = clean_env(home, tmp_path, SHARDPORT_FAILPOINT=failpoint)
    up = watch_up(_up(store, "--ladder", "sample"), env)
    assert up.code == 6, up.err[-3000:]  # unavailable: a lost rank, not the rank's own failure (1)
    lines = [line for line in up.err.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith(
        f"registry up: error: rank {rank}: its actor died during {phase}"
    )
    assert not up.leaks() and not partial_files(tmp_path)


def test_a_drained_rank_is_relaunched_under_retries(home: Path, tmp_path: Path) -> None:
    store = _pushed(tmp_path)
    # armed for every attempt: the relaunch must be drained too; the failpoint fires once per process
    env = clean_env(home, tmp_path, SHARDPORT_FAILPOINT="rank1-fetch:term")
    up = watch_up(["--json", *_up(store, "--retries", "1", "--ladder", "off")], env)
    assert up.code == 6, up.err[-3000:]
    doc = json.loads(up.out)["error"]
    assert doc["exit_code"] == 6 and "attempt 2 of 2" in doc["message"]
    assert "attempt 1: rank 1 lost during prepare" in doc["message"]
    assert not up.leaks()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_driver_tears_everything_down(home: Path, tmp_path: Path, signum: int) -> None:
    """It unwinds (teardown), says so in one line and ends by the signal: the shell shows 143 / 130."""
    store = _pushed(tmp_path)
    env = clean_env(home, tmp_path, SHARDPORT_FAILPOINT="rank0-warm-up:pause")  # ranks held in run
    sent: list[float] = []

    def stop(proc: subprocess.Popen[str], pids: set[int], sockets: set[tuple[str, str, int]]) -> None:
        ranks = {pid for _, name, pid in sockets if "RankActor" in name}
        if len(ranks) == 2 and not sent:
            time.sleep(3)
            proc.send_signal(signum)
            sent.append(time.monotonic())

    up = watch_up(_up(store, "--ladder", "off"), env, act=stop)
    assert sent, "the ranks never came up"
    assert up.code == -signum, up.err[-3000:]
    lines = [line for line in up.err.splitlines() if line.strip()]
    name = signal.Signals(signum).name
    assert lines == [f"registry up: interrupted by {name}: stopped, and what it had started was torn down"]
    assert not up.leaks() and not partial_files(tmp_path)


def test_a_killed_drivers_leftovers_are_removed_by_the_next_bring_up(home: Path, tmp_path: Path) -> None:
    store = _pushed(tmp_path)
    env = clean_env(home, tmp_path, SHARDPORT_FAILPOINT="rank0-warm-up:pause")
    killed: list[set[int]] = []

    def kill(proc: subprocess.Popen[str], pids: set[int], sockets: set[tuple[str, str, int]]) -> None:
        if len({pid for _, name, pid in sockets if "RankActor" in name}) == 2 and not killed:
            killed.append(tree(proc.pid))
            proc.send_signal(signal.SIGKILL)

    up = watch_up(_up(store, "--ladder", "off"), env, act=kill)
    assert killed and up.code == -signal.SIGKILL
    left = owned_folders(up.pid)
    assert left  # SIGKILL runs no cleanup: its folder (and some of Ray's agents) outlive it
    assert scratch.owner_alive(left[0]) is False
    removed = scratch.sweep()  # what the next bring-up does first
    assert set(left) <= set(removed)
    deadline = time.monotonic() + 20
    while any(running(p) for p in killed[0] - {up.pid}) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not [p for p in killed[0] - {up.pid} if running(p)]
    assert not any(f.exists() for f in left)
