"""``registry up --retries N``: a lost rank (its actor killed through Ray's API while the first attempt
runs) relaunches the whole bring-up; a rank's own failure never does; nothing is left behind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from bringup_artifacts import gguf_tiny, gptq_tiny
from llama_artifacts import ok

from shardport.cli import main
from shardport.cli.parser import build_parser
from shardport.deploy.errors import RankFailedError, RankLostError
from shardport.deploy.rank import RankSpec
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up, ray_launcher
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.errors import UsageError
from shardport.registry.evidence import read_evidence
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key
from shardport.registry.trust.resolve import resolve

PROMPT = (1, 5, 300, 7, 396)


def _push(home: Path, tmp: Path, folder: Path, ref: str) -> str:
    store = str(tmp / "store")
    if not (home / "keys").exists():
        ok(store, "keygen")
    ok(store, "push", folder, ref)
    return store


class KillOnce:
    """From a thread, kill the first live actor of rank ``rank`` once: ``ray.kill`` on its Ray name, or
    (``crash=True``) ``signum`` to the process Ray's actor table names: SIGKILL as a crash or the OOM killer
    would, SIGTERM as a node or pod drain does, SIGSTOP as a frozen machine looks.

    It watches the GCS actor table, so it sees the first attempt's actors as soon as they have a
    process; it also records every bring-up actor process it saw, so the test can check none survives.
    """

    def __init__(self, ray: Any, rank: int, *, crash: bool = False, signum: int = signal.SIGKILL) -> None:
        self.ray, self.rank, self.crash, self.signum = ray, rank, crash, signum
        self.killed: list[str] = []
        self.pids: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        from ray._private import state

        while not self.stop.is_set():
            for actor in state.actors().values():
                name, pid = str(actor.get("Name") or ""), int(actor.get("Pid") or 0)
                if actor.get("State") != "ALIVE" or not name.startswith("shardport-") or not pid:
                    continue
                self.pids.add(pid)
                if not self.killed and name.endswith(f"-rank-{self.rank}"):
                    if self.crash:
                        os.kill(pid, self.signum)
                    else:
                        self.ray.kill(self.ray.get_actor(name), no_restart=True)
                    self.killed.append(name)
            self.stop.wait(0.05)

    def __enter__(self) -> KillOnce:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def assert_no_process_left(self) -> None:
        deadline = time.monotonic() + 15
        left = [p for p in self.pids if _running(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if _running(p)]
        assert self.pids and not left, f"rank actor processes still running: {left}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.ray
@pytest.mark.slow
def test_a_rank_lost_once_is_relaunched_and_the_evidence_shows_both_attempts(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    up = ["up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,5,300", "--generate", "2", "--retries", "1"]
    out = io.StringIO()
    with KillOnce(ray_ranks, rank=1, crash=True) as killer, contextlib.redirect_stdout(out):
        code = main(["--store", store, "--json", *up])
    doc = json.loads(out.getvalue())  # one document: Ray's notice of the dead worker went to stderr
    assert code == 0 and doc["passed"], doc
    assert len(killer.killed) == 1
    assert [a["outcome"] for a in doc["attempts"]] == ["lost", "ok"]
    lost = doc["attempts"][0]
    # killed as soon as it had a process: during prepare (run, should the machine be very slow)
    assert lost["attempt"] == 1 and lost["rank"] == 1 and lost["stage"] in ("prepare", "run")
    assert f"rank 1: its actor died during {lost['stage']}" in lost["reason"] and lost["seconds"] > 0
    assert doc["devices"] == {"0": "cpu", "1": "cpu"}
    assert all(m["device_resident"] == m["device_peak"] == 0 for m in doc["memory"].values())
    assert all(m["bytes_assigned"] > 0 and m["host_resident"] > 0 for m in doc["memory"].values())
    session = Session.open(store)
    stored = read_evidence(session, "llama/gptq", doc["digest"]).verified
    assert [a["outcome"] for a in stored[0].predicate["attempts"]] == ["lost", "ok"]
    killer.assert_no_process_left()
    # the ray_ranks fixture asserts no actor and no placement group is left


@pytest.mark.ray
@pytest.mark.slow
def test_the_relaunch_is_reported_as_progress(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    events: list[tuple[int, str]] = []
    request = UpRequest(
        ref="llama/gptq:v1", tokens=PROMPT, steps=2, tp=2, store=store, ladder=False, retries=2
    )
    with KillOnce(ray_ranks, rank=0) as killer:
        result = bring_up(
            Session.open(store),
            request,
            launcher=ray_launcher(None),
            progress=lambda r, w: events.append((r, w)),
            store_evidence=False,
        )
    assert len(killer.killed) == 1 and [a["outcome"] for a in result.to_json()["attempts"]] == ["lost", "ok"]
    stage = result.to_json()["attempts"][0]["stage"]
    assert (0, f"lost during {stage}; relaunching (attempt 2 of 3)") in events
    late = [row for row in result.predicate["parity"] if row["level"] in ("L4", "L5")]
    assert late and not [r for r in late if r["status"] == "fail"] and any(r["passed"] for r in late), late
    killer.assert_no_process_left()


@pytest.mark.ray
@pytest.mark.slow
def test_without_retries_a_lost_rank_fails_cleanly(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    session = Session.open(store)
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, steps=2, tp=2, store=store, ladder=False)
    with KillOnce(ray_ranks, rank=1) as killer, pytest.raises(RankLostError) as caught:
        bring_up(session, request, launcher=ray_launcher(None))
    lost = caught.value
    assert lost.rank == 1 and lost.stage in ("prepare", "run") and lost.exit_code == 6
    assert str(lost).startswith(f"rank 1: its actor died during {lost.stage}")
    assert [a["outcome"] for a in lost.attempts] == ["lost"]
    digest = resolve(session, parse_ref("llama/gptq:v1")).digest
    assert not read_evidence(session, "llama/gptq", digest).verified  # nothing stored for a failure
    killer.assert_no_process_left()


@pytest.mark.ray
@pytest.mark.slow
def test_a_drained_rank_is_lost_and_relaunched(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    """SIGTERM (a node or pod drain) is a lost rank like SIGKILL, never the rank's own failure."""
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    request = UpRequest(
        ref="llama/gptq:v1", tokens=PROMPT, steps=2, tp=2, store=store, ladder=False, retries=1
    )
    with KillOnce(ray_ranks, rank=1, crash=True, signum=signal.SIGTERM) as killer:
        result = bring_up(Session.open(store), request, launcher=ray_launcher(None), store_evidence=False)
    attempts = result.to_json()["attempts"]
    assert len(killer.killed) == 1 and [a["outcome"] for a in attempts] == ["lost", "ok"]
    assert attempts[0]["rank"] == 1 and "its actor died" in attempts[0]["reason"]
    killer.assert_no_process_left()


@pytest.mark.ray
@pytest.mark.slow
def test_a_stopped_rank_is_lost_after_its_stage_timeout(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    request = UpRequest(
        ref="llama/gptq:v1", tokens=PROMPT, tp=2, store=store, ladder=False, stage_timeout=15.0
    )
    t0 = time.monotonic()
    with (
        KillOnce(ray_ranks, rank=1, crash=True, signum=signal.SIGSTOP) as killer,
        pytest.raises(RankLostError) as caught,
    ):
        bring_up(Session.open(store), request, launcher=ray_launcher(None, request=request))
    assert caught.value.rank == 1 and caught.value.exit_code == 6
    assert f"ranks [1]: no answer to {caught.value.stage} within 15 s" in str(caught.value)
    assert time.monotonic() - t0 < 120  # not the old 600 s per stage
    killer.assert_no_process_left()  # a stopped process is killed all the same


@pytest.mark.parametrize("when", ["before the bring-up", "between plan and fetch"])
def test_a_tampered_tile_is_not_retried(home: Path, tmp_path: Path, when: str) -> None:
    """A tile flipped in the store, before the bring-up or after the driver planned (its launcher called)
    and before the rank fetched: the rank names itself and the tensor, nothing is relaunched or stored."""
    store = _push(home, tmp_path, gguf_tiny(tmp_path / "gguf"), "llama/gguf:v1")
    session = Session.open(store)
    negative = UpRequest(ref="llama/gguf:v1", tokens=PROMPT, store=store, retries=-1)
    with pytest.raises(UsageError, match=r"--retries -1: expected 0 or more"):
        bring_up(session, negative, launcher=run_in_process)
    resolved = resolve(session, parse_ref("llama/gguf:v1"))
    entry = next(t for t in resolved.manifest.tensors or [] if t.name == "blk.1.ffn_up.weight")
    blob = next(f.digest for f in resolved.manifest.files if f.path == entry.file)

    def tamper() -> None:
        data = bytearray(session.store.read(blob_key(blob)))
        data[entry.start + 5] ^= 0x10
        session.store.put(blob_key(blob), bytes(data))

    if when == "before the bring-up":
        tamper()
    launches: list[int] = []

    def counted(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        if when == "between plan and fetch":
            tamper()
        launches.append(len(specs))
        return run_in_process(specs)

    request = UpRequest(ref="llama/gguf:v1", tokens=PROMPT, store=store, ladder=False, retries=2)
    with pytest.raises(RankFailedError) as caught:
        bring_up(session, request, launcher=counted)
    assert caught.value.kind == "TileDigestMismatchError" and "blk.1.ffn_up.weight" in str(caught.value)
    assert caught.value.exit_code == 1 and "rank 0" in str(caught.value)
    assert launches == [1]  # aborted at once with the rank's reason, never relaunched
    assert not read_evidence(session, "llama/gguf", resolved.digest).verified  # nothing stored


def test_retries_on_the_command_line() -> None:
    args = build_parser().parse_args(["up", "llama/q:v1", "--tokens", "1,2", "--retries", "2"])
    assert args.retries == 2
    assert build_parser().parse_args(["up", "llama/q:v1", "--tokens", "1"]).retries == 0


def test_the_human_output_names_each_lost_attempt() -> None:
    from shardport.cli.bringup import render

    result = {
        "passed": True,
        "repository": "llama/q",
        "digest": "sha256:" + "ab" * 32,
        "topology": {"tp": 2, "ep": 1, "pp": 1},
        "generated": [3, 4],
        "parity": [],
        "timeline": {},
        "attempts": [
            {"attempt": 1, "outcome": "lost", "rank": 1, "stage": "run", "reason": "…", "seconds": 4.31},
            {"attempt": 2, "outcome": "ok", "seconds": 6.0},
        ],
    }
    text = render(result)
    assert "attempt 1: rank 1 lost during run after 4.3 s (relaunched)" in text
    assert "attempt 2" not in text


def test_a_relaunch_the_surviving_nodes_cannot_hold_ends_as_the_loss_with_the_arithmetic() -> None:
    from shardport.deploy.launch import launch_with_retries
    from shardport.placement import Topology
    from shardport.placement.nodes import NodeCapacityError, NodeView, place_on_nodes

    alive = [NodeView("a" * 32, "10.0.0.1", 1.0, 1.0), NodeView("b" * 32, "10.0.0.2", 1.0, 1.0)]

    def launch(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        # the real placement over the nodes still alive: the first attempt loses node b
        place_on_nodes(Topology(tp=1, pp=2), alive, use_gpus=True, cpu_share=1.0)
        alive.pop()
        raise RankLostError(
            "node bbbb (10.0.0.2) was lost during fetch: ranks [1] ran on it", rank=1, stage="fetch"
        )

    with pytest.raises(RankLostError) as caught:
        launch_with_retries(launch, [], retries=2)
    message = str(caught.value)
    assert message.startswith("node bbbb (10.0.0.2) was lost during fetch: ranks [1] ran on it; relaunching")
    assert "refused: 1x1x2 = 2 ranks; the nodes hold 1 rank(s) in all" in message
    assert caught.value.exit_code == 6 and caught.value.stage == "fetch" and caught.value.rank == 1
    assert [a["outcome"] for a in caught.value.attempts] == ["lost"]
    assert isinstance(caught.value.__cause__, NodeCapacityError)
    with pytest.raises(NodeCapacityError):  # a first launch the cluster cannot hold stays a refusal (exit 2)
        launch_with_retries(launch, [], retries=2)
