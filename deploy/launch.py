"""How a bring-up's ranks are launched: the launcher protocols, the Ray launcher, the overlap and retries.

A :data:`Launcher` runs one whole launch from the ranks' specs. A :class:`StartingLauncher` (the Ray one,
:class:`RayLauncher`) can also start its ranks before their specs exist (join or start the cluster,
place the actors, let them import torch): :func:`start_while_planning` starts it while the driver plans.
:func:`launch_with_retries` relaunches the whole bring-up after a lost rank, up to ``--retries`` times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from shardport.placement import Topology
from shardport.placement.nodes import NodeCapacityError
from shardport.registry.errors import UsageError

from .errors import RankLostError
from .rank import RankSpec

Launcher = Callable[[Sequence[RankSpec]], list[dict[str, Any]]]
Progress = Callable[[int, str], None]
T = TypeVar("T")


class Started(Protocol):
    """A launch started before its specs exist: ranks already booting."""

    def launch(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        """Hand the ranks their specs, prepare and run them; every report. Tears the launch down."""
        ...

    def close(self) -> None:
        """Tear down a launch (never made, or made); safe to repeat."""
        ...


@runtime_checkable
class StartingLauncher(Protocol):
    """A :data:`Launcher` that can also start ``world`` ranks before their specs exist."""

    def __call__(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        """One whole launch, started fresh (a relaunch after a lost rank)."""
        ...

    def start(self, topology: Topology) -> Started:
        """Start ``topology``'s ranks now (returns once they are booting); the specs follow."""
        ...


@dataclass(frozen=True)
class RayLauncher:
    """The ranks as Ray actors (an existing cluster at ``address``, or an embedded one on loopback).

    ``progress(rank, what)``: called as each rank starts and finishes a stage (prepare: load, dispatch,
    ladder; run: graph, generation).
    """

    address: str | None
    progress: Progress | None = None
    stage_timeout: float | None = None
    connect_timeout: float = 30.0
    verbose: bool = False

    def start(self, topology: Topology) -> Started:
        """Join (or start) the cluster and start one actor per rank, importing; the specs follow."""
        from .ray_ranks import StartedRayRanks

        return StartedRayRanks(
            self.address,
            topology,
            progress=self.progress,
            stage_timeout=self.stage_timeout,
            connect_timeout=self.connect_timeout,
            verbose=self.verbose,
        )

    def __call__(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        """One launch from scratch (a relaunch after a lost rank)."""
        first = specs[0]
        return self.start(Topology(tp=first.tp, ep=first.ep, pp=first.pp)).launch(specs)


def start_while_planning(
    launcher: StartingLauncher, topology: Topology, planning: Callable[[], T]
) -> tuple[T, Started]:
    """Start ``topology``'s ranks (this thread) while ``planning`` runs in another; both results.

    The start (joining or starting the cluster, placing the actors) mostly waits on other processes,
    and the ranks then import for seconds: the driver's resolve and plan fit inside. A planning failure
    tears the started ranks down and is raised (also when the start failed too: a refused plan is what
    the user has to fix; the start's error is its context); a start failure alone is raised as it is.
    """
    outcome: dict[str, Any] = {}

    def plan() -> None:
        try:
            outcome["planned"] = planning()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    # a daemon thread, joined by hand: an interrupt (Ctrl-C) while the plan is stuck (a hung store)
    # ends the driver at once; a pool's worker would be joined at exit, however long the plan takes
    thread = threading.Thread(target=plan, name="shardport-plan", daemon=True)
    thread.start()
    try:
        started = launcher.start(topology)
    except Exception:  # not an interrupt: that propagates as it is
        thread.join()
        refused = outcome.get("error")
        if refused is not None:
            raise refused  # noqa: B904 - the start's error stays its __context__
        raise
    try:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["planned"], started
    except BaseException:
        started.close()
        raise


def launch_with_retries(
    launch: Launcher,
    specs: Sequence[RankSpec],
    retries: int,
    progress: Callable[[int, str], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Launch the ranks; after a lost rank, relaunch the whole bring-up up to ``retries`` times.

    Only :class:`RankLostError` (an actor died, a node went away, a rank stopped answering) is retried:
    by then the launcher has torn everything down (actors, placement group, process group), so each
    attempt starts clean, placed on the nodes still alive. A relaunch those nodes cannot hold
    (:class:`~shardport.placement.nodes.NodeCapacityError`) ends the retries as a
    :class:`RankLostError` naming the loss and the refusal's arithmetic. A rank's own failure
    (validation, admission, I/O: :class:`RankFailedError`) and every other error propagate at once.
    Returns the reports and one record per attempt (``attempt``, ``outcome`` lost/ok, ``seconds``; a
    lost one also ``rank``, ``stage``, ``reason``).
    When the last attempt is lost, its error is raised with ``attempts`` set (and, after retries, the
    earlier attempts named in its message).
    """
    if retries < 0:
        raise UsageError(f"--retries {retries}: expected 0 or more")
    attempts: list[dict[str, Any]] = []
    for attempt in range(1, retries + 2):
        t0 = time.perf_counter()
        try:
            reports = launch(specs)
        except NodeCapacityError as exc:
            if not attempts:  # the first launch: the cluster never could hold it (exit 2, as it is)
                raise
            # a relaunch after a lost node: the surviving nodes cannot hold the topology
            lost = RankLostError(
                f"{attempts[-1]['reason']}; relaunching on the surviving nodes was refused: {exc}",
                rank=attempts[-1]["rank"],
                stage=str(attempts[-1]["stage"]),
            )
            lost.attempts = attempts
            raise lost from exc
        except RankLostError as exc:
            attempts.append(
                {
                    "attempt": attempt,
                    "outcome": "lost",
                    "rank": exc.rank,
                    "stage": exc.stage,
                    "reason": str(exc),
                    "seconds": time.perf_counter() - t0,
                }
            )
            if attempt <= retries:
                if progress is not None:
                    what = f"lost during {exc.stage}; relaunching (attempt {attempt + 1} of {retries + 1})"
                    progress(-1 if exc.rank is None else exc.rank, what)
                continue
            if retries == 0:
                exc.attempts = attempts
                raise
            earlier = "; ".join(
                f"attempt {a['attempt']}: rank {a['rank']} lost during {a['stage']}" for a in attempts[:-1]
            )
            final = RankLostError(
                f"{exc} (attempt {attempt} of {retries + 1}; {earlier})", rank=exc.rank, stage=exc.stage
            )
            final.attempts = attempts
            raise final from exc
        attempts.append({"attempt": attempt, "outcome": "ok", "seconds": time.perf_counter() - t0})
        return reports, attempts
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover
