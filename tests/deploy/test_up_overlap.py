"""The launch starts while the driver plans (``start_while_planning``), after the driver admitted the
request (``admit``: nothing starts for a request it refuses, test_up_admission): a refused plan tears
the started ranks down and raises its own error, a relaunch after a lost rank starts fresh, and the
driver's plan imports no torch."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gguf_mixtral, gptq_tiny
from llama_artifacts import ok

from shardport.deploy.errors import ClusterError, RankLostError
from shardport.deploy.launch import Started, StartingLauncher
from shardport.deploy.rank import RankSpec
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up, ray_launcher
from shardport.placement.errors import UnsplittableError
from shardport.registry.errors import NotFoundError, UsageError
from shardport.registry.session import Session

#: A cluster the driver joins (the launchers here are given; admission leaves the plan to the start).
JOINED = "127.0.0.1:6379"
PROMPT = (1, 5, 300, 7)


def _push(tmp: Path) -> str:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp / "gptq"), "llama/gptq:v1")
    return store


def _push_unlisted(tmp: Path, folder: Path, name: str) -> str:
    """Pushed by the library without the CLI's runtime/topology layers (as before the layer existed):
    the driver's ``check_degrees`` has no list to refuse from, so the placement plan refuses, after the
    launch started."""
    from shardport.registry.push import push

    store = str(tmp / "store")
    ok(store, "keygen")
    repository, tag = name.split(":")
    push(Session.open(store), folder, repository, tag)
    return store


class _Booted:
    """A started launch: records what the driver did with it; ``lose`` makes its launch a lost rank."""

    def __init__(self, log: list[str], world: int, lose: bool) -> None:
        self.log, self.world, self.lose = log, world, lose
        log.append(f"start {world}")

    def launch(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        self.log.append(f"launch {len(specs)}")
        if self.lose:
            raise RankLostError("rank 0: its actor died during prepare", rank=0, stage="prepare")
        return run_in_process(specs)

    def close(self) -> None:
        self.log.append("close")


class _Starting:
    """A launcher that starts before its specs exist; each rank runs in this process (world 1)."""

    def __init__(self, *, lose_first: bool = False, start_error: Exception | None = None) -> None:
        self.log: list[str] = []
        self.lose_first, self.start_error = lose_first, start_error

    def start(self, topology: Any) -> Started:
        world = topology.world_size
        if self.start_error is not None:
            self.log.append("start failed")
            raise self.start_error
        return _Booted(self.log, world, lose=self.lose_first and not self.log)

    def __call__(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        self.log.append(f"fresh {len(specs)}")
        return run_in_process(specs)


def test_the_ray_launcher_starts_before_its_specs() -> None:
    assert isinstance(ray_launcher(None), StartingLauncher)
    assert isinstance(_Starting(), StartingLauncher)
    assert not isinstance(run_in_process, StartingLauncher)


def test_a_refused_plan_closes_the_started_launch_and_raises_the_plans_error(
    home: Path, tmp_path: Path
) -> None:
    store = _push_unlisted(tmp_path, Path(gptq_tiny(tmp_path / "gptq")), "llama/gptq:v1")
    launcher = _Starting()
    # tp 6 fits the 6 heads (3 kv heads, 2 each), but o_proj's K = 192 holds 3 groups of 64: the
    # placement plan refuses it, while the launch is already started
    # on a joined cluster (``--address``: the ranks' devices are theirs to know, so the driver plans while
    # the launch starts); the embedded default plans in admission, before anything starts
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, tp=6, store=store, ladder=False, address=JOINED)
    with pytest.raises(UnsplittableError, match=r"holds 3 whole unit\(s\) of 64"):
        bring_up(Session.open(store), request, launcher=launcher)
    assert launcher.log == ["start 6", "close"]  # started while planning, never launched, torn down
    launcher = _Starting()
    with pytest.raises(UnsplittableError, match=r"holds 3 whole unit\(s\) of 64"):
        bring_up(Session.open(store), dataclasses.replace(request, address=None), launcher=launcher)
    assert launcher.log == []
    # an unknown reference: the resolve's own error, before anything starts (admission resolves)
    launcher = _Starting()
    with pytest.raises(NotFoundError, match="llama/absent"):
        bring_up(
            Session.open(store),
            UpRequest(ref="llama/absent:v1", tokens=PROMPT, store=store),
            launcher=launcher,
        )
    assert launcher.log == []


def test_a_refused_plan_wins_over_a_failed_start(home: Path, tmp_path: Path) -> None:
    store = _push_unlisted(tmp_path, Path(gptq_tiny(tmp_path / "gptq")), "llama/gptq:v1")
    refused = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, tp=6, store=store, ladder=False, address=JOINED)
    launcher = _Starting(start_error=ClusterError("cannot start or join Ray"))
    with pytest.raises(UnsplittableError, match="o_proj") as caught:
        bring_up(Session.open(store), refused, launcher=launcher)
    assert isinstance(caught.value.__context__, ClusterError)  # the start's failure is its context
    fine = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store, ladder=False)
    with pytest.raises(ClusterError, match="cannot start or join Ray"):
        bring_up(Session.open(store), fine, launcher=launcher)
    assert launcher.log == ["start failed", "start failed"]


def test_request_errors_are_raised_before_anything_starts(home: Path, tmp_path: Path) -> None:
    store = _push(tmp_path)
    launcher = _Starting()
    for bad, message in [
        ({"retries": -1}, r"--retries -1: expected 0 or more"),
        ({"steps": 0}, r"--generate 0: expected at least 1"),
        ({"tp": 0}, r"--tp 0: expected at least 1"),
        ({"ep": -2}, r"--ep -2: expected at least 1"),
        ({"pp": 0}, r"--pp 0: expected at least 1"),
        ({"ladder": "most"}, r"ladder"),
        ({"activations": "fp8"}, r"--activations 'fp8': expected one of auto, float32, bfloat16"),
    ]:
        request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, store=store, **bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=message):
            bring_up(Session.open(store), request, launcher=launcher)
    assert launcher.log == []


def test_the_started_launch_runs_first_and_a_relaunch_starts_fresh(home: Path, tmp_path: Path) -> None:
    store = _push(tmp_path)
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, steps=2, store=store, ladder=False)
    launcher = _Starting()
    result = bring_up(Session.open(store), request, launcher=launcher, store_evidence=False)
    assert launcher.log == ["start 1", "launch 1", "close"]
    timeline = result.predicate["timeline"]["0"]
    assert list(timeline)[:3] == ["resolve", "plan", "launch"] and timeline["launch"] >= 0.0
    assert result.reports[0]["clock"]["prepare"] <= result.reports[0]["clock"]["resolve"]

    lost_once = _Starting(lose_first=True)
    retried = UpRequest(**{**request.__dict__, "retries": 1})
    result = bring_up(Session.open(store), retried, launcher=lost_once, store_evidence=False)
    assert lost_once.log == ["start 1", "launch 1", "fresh 1", "close"]  # the relaunch is a fresh start
    assert [a["outcome"] for a in result.predicate["attempts"]] == ["lost", "ok"]


def test_the_drivers_plan_imports_no_torch(home: Path, tmp_path: Path) -> None:
    store = _push(tmp_path)
    script = (
        "import sys\n"
        "from shardport.deploy.up import UpRequest, _plan\n"
        "from shardport.registry.session import Session\n"
        f"request = UpRequest(ref='llama/gptq:v1', tokens=(1, 5), tp=2, store={store!r})\n"
        f"planned = _plan(Session.open({store!r}), request)\n"
        "assert len(planned.specs) == 2, planned.specs\n"
        "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_a_refused_plan_tears_the_started_actors_down(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push_unlisted(tmp_path, Path(gguf_mixtral(tmp_path / "moe")), "llama/gmoe:v1")
    events: list[tuple[int, str]] = []
    # the K-quant experts' K = 256 cannot split at tp 2 (test_up_gguf_moe): refused by the placement plan
    request = UpRequest(
        ref="llama/gmoe:v1", tokens=PROMPT, tp=2, ep=2, store=store, ladder=False, address=JOINED
    )
    with pytest.raises(UnsplittableError, match="ffn_down_exps"):
        bring_up(
            Session.open(store), request, launcher=ray_launcher(None, lambda r, w: events.append((r, w)))
        )
    assert sorted(events) == [(r, "started") for r in range(4)]  # every actor was up when the plan failed
    # the ray_ranks fixture asserts no actor and no placement group is left


def test_an_interrupt_while_the_plan_hangs_ends_the_driver_at_once() -> None:
    """Ctrl-C while resolve/plan hangs (a stalled store): the started ranks are closed and the process
    exits without waiting for the planning thread."""
    child = textwrap.dedent(
        """
        import signal, time
        from shardport.deploy.launch import start_while_planning
        from shardport.placement import Topology
        # a parent (pytest after Ray started in it) may ignore SIGINT, and children inherit that
        signal.signal(signal.SIGINT, signal.default_int_handler)
        class Booted:
            def launch(self, specs): return []
            def close(self): print("closed", flush=True)
        class Starting:
            def __call__(self, specs): return []
            def start(self, world): return Booted()
        def planning():
            time.sleep(60)
        print("ready", flush=True)
        start_while_planning(Starting(), Topology(tp=1), planning)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=50)
    assert time.monotonic() - sent < 20  # the plan would hold it 60 s
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "closed" in out
