"""The thin Ray layer: one actor per rank in one placement group, torn down whatever happens.

:class:`RayRanks` places one actor per bundle (``{"GPU": 1}`` per rank where the cluster has GPUs for
every rank, a share of the CPUs otherwise: :meth:`Cluster.bundle`) before the ranks' specs exist: each
actor starts importing what a rank needs (:func:`~.rank.warm_imports`) at once, while the driver still
resolves and plans (:class:`StartedRayRanks` joins the cluster and starts the actors; the driver hands
it the specs when its plan is done). It then calls ``prepare`` on every rank (a :class:`~.rank.Rank`
built from its spec), and only when every rank prepared, ``run`` with the rendezvous (a file
store in the bring-up's private folder, gloo and NCCL on loopback, when every rank reported the
driver's node: :mod:`.rendezvous`; each rank joins with gloo, or NCCL on a CUDA device:
:mod:`.devices`). The driver waits for each stage as long as :mod:`.stage_budget` allows for the
model's size. A rank
that reports a failure aborts the bring-up with :class:`RankFailedError` (rank, stage, reason);
an actor that dies (or whose answer is lost with its node) is a :class:`RankLostError` naming the rank
and the phase (``prepare`` or ``run``). A rank process sent SIGTERM (how nodes and pods are drained)
dies at once, as with SIGKILL, and is a lost rank too: ``--retries`` applies.
:meth:`RayRanks.close` kills every actor and removes the placement group (the ranks destroy their
process groups themselves, or die with them). Each actor is named ``shardport-<bring-up id>-rank-<r>``
(:func:`actor_name`) so that an operator (``ray list actors``) sees which rank of which bring-up a
process is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .cluster import CONNECT_TIMEOUT_S, Cluster, connect, driver_node
from .errors import ClusterError, RankFailedError, RankLostError
from .rank import Rank, RankSpec, failure, warm_imports
from .rendezvous import Rendezvous, rendezvous_for
from .stage_budget import PLACEMENT_S, StageTimeouts, stage_timeouts

Progress = Callable[[int, str], None]


class _RankActor:
    """The actor body: started without a spec (:meth:`warm`), then a :class:`Rank` and its two calls."""

    def __init__(self) -> None:
        # Ray's worker turns SIGTERM into SystemExit inside whatever the rank runs, which the rank would
        # report as its own failure (exit 1, never retried). A drained node's rank is lost, not failed:
        # die at once, as with SIGKILL; the driver sees the actor die (RankLostError, --retries applies).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.clock = {"started": time.time()}
        self.warm_error: BaseException | None = None
        self.rank: Rank | None = None

    def warm(self) -> None:
        """Import what a rank needs (no spec yet); a failure is the rank's, reported by :meth:`prepare`."""
        try:
            warm_imports()
        except BaseException as exc:  # an import that fails here fails the rank's prepare, as data
            self.warm_error = exc
        self.clock["imported"] = time.time()

    def prepare(self, spec: RankSpec, env: dict[str, str]) -> dict[str, Any]:
        os.environ.update(env)
        self.rank = Rank(spec)
        self.rank.clock.update(self.clock)
        if self.warm_error is not None:
            return {"failure": failure(spec.rank, "start", self.warm_error)}
        out = self.rank.prepare()
        import ray

        out["node"] = str(ray.get_runtime_context().get_node_id())  # where this rank runs (rendezvous)
        return out

    def run(self, rendezvous: Rendezvous | None) -> dict[str, Any]:
        if self.rank is None:
            raise ClusterError("run before prepare")
        if rendezvous is not None:
            os.environ.update(rendezvous.env)
        out = self.rank.run(None if rendezvous is None else rendezvous.init_method)
        if "failure" not in out:  # the GPUs Ray gave this rank (its bundle's), whatever it computes on
            import ray

            out["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        return out

    def pid(self) -> int:
        return os.getpid()


#: What a rank's process needs from the driver's environment: store credentials and endpoint, the home.
_PASSED_ENV = ("AWS_", "SHARDPORT_")


def _env() -> dict[str, str]:
    """The driver's store credentials and settings, for the rank actors (passed with ``prepare``).

    Ray workers do not inherit variables set after the cluster started. Not a ``runtime_env``: an actor
    with one cannot take one of the worker processes Ray already started, and waits seconds for its own.
    """
    return {k: v for k, v in os.environ.items() if k.startswith(_PASSED_ENV)}


def actor_name(bring_up: str, rank: int) -> str:
    """The Ray name of ``rank``'s actor in the bring-up ``bring_up`` (unique while it is alive)."""
    return f"shardport-{bring_up}-rank-{rank}"


def raise_failures(results: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`RankFailedError` for the first failed rank (every failed rank named in it)."""
    failed = [r["failure"] for r in results if "failure" in r]
    if not failed:
        return
    first = min(failed, key=lambda f: int(f["rank"]))
    others = [f"rank {f['rank']} at {f['stage']}: {f['kind']}" for f in failed if f is not first]
    message = first["message"] + (f" (also failed: {'; '.join(others)})" if others else "")
    raise RankFailedError(
        int(first["rank"]), str(first["stage"]), str(first["kind"]), message, int(first["exit_code"])
    )


class RayRanks:
    """The ``world`` actors of one bring-up on ``cluster``; use as a context manager (teardown on exit).

    The actors start importing at construction; :meth:`prepare` hands them their specs.
    """

    def __init__(
        self,
        cluster: Cluster,
        world: int,
        *,
        timeouts: StageTimeouts | None = None,
        progress: Progress | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.cluster, self.progress = ray, cluster, progress
        self.timeouts = timeouts or stage_timeouts(0, world, 1)
        self.nodes: list[str] = []
        self.specs: list[RankSpec] = []
        self.id = uuid.uuid4().hex[:12]
        bundle = cluster.bundle(world)
        self.group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
        self.actors: list[Any] = []
        try:
            ready = self.group.ready()
            done, _ = ray.wait([ready], timeout=PLACEMENT_S)
            if not done:
                raise ClusterError(
                    f"cannot place {world} ranks of {bundle} on the cluster ({cluster.cpus:g} CPUs, "
                    f"{cluster.gpus} GPUs): the placement group did not schedule in time"
                )
            actor = ray.remote(_RankActor)
            for rank in range(world):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=rank
                )
                handle: Any = actor.options(
                    name=actor_name(self.id, rank),
                    num_cpus=bundle.get("CPU", 0.0),
                    num_gpus=bundle.get("GPU", 0.0),
                    scheduling_strategy=strategy,
                    max_restarts=0,
                ).remote()
                self.actors.append(handle)
                handle.warm.remote()  # the imports start now; prepare queues behind them
                if progress is not None:
                    progress(rank, "started")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RayRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gather(self, refs: list[Any], what: str) -> list[dict[str, Any]]:
        """Every rank's answer, in rank order; the first failure or death raises at once.

        Ranks are waited on together, so a rank that failed or died is seen while the others may still
        wait for it in a collective; raising here lets :meth:`close` end them instead of their timeout.
        """
        ray = self.ray
        rank_of = {ref: spec.rank for spec, ref in zip(self.specs, refs, strict=True)}
        results: dict[int, dict[str, Any]] = {}
        pending = list(refs)
        timeout = self.timeouts.of(what)
        deadline = time.monotonic() + timeout
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                ranks = sorted(rank_of[r] for r in pending)
                raise RankLostError(
                    f"ranks {ranks}: no answer to {what} within {timeout:g} s (the stage's timeout for this "
                    "model; --stage-timeout sets it); the bring-up was aborted and every rank torn down",
                    rank=ranks[0],
                    stage=what,
                )
            for ref in done:
                rank = rank_of[ref]
                try:
                    results[rank] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    raise RankLostError(
                        f"rank {rank}: its actor died during {what} ({type(exc).__name__}); "
                        "the bring-up was aborted and every other rank torn down",
                        rank=rank,
                        stage=what,
                    ) from exc
                except ray.exceptions.ObjectLostError as exc:  # its answer went with its node
                    raise RankLostError(
                        f"rank {rank}: its answer to {what} was lost with its node ({type(exc).__name__}); "
                        "the bring-up was aborted and every other rank torn down",
                        rank=rank,
                        stage=what,
                    ) from exc
                raise_failures([results[rank]])
                if self.progress is not None:
                    self.progress(rank, f"{what} done")
        return [results[spec.rank] for spec in self.specs]

    def pids(self) -> list[int]:
        """The actors' process ids (tests)."""
        return [int(p) for p in self.ray.get([a.pid.remote() for a in self.actors], timeout=60.0)]

    def prepare(
        self, specs: Sequence[RankSpec], timeouts: StageTimeouts | None = None
    ) -> list[dict[str, Any]]:
        """Every rank's ``prepare`` with its spec (rank r to actor r); raises for the first failed rank."""
        if [s.rank for s in specs] != list(range(len(self.actors))):
            raise ClusterError(
                f"specs for ranks {[s.rank for s in specs]}: expected one per started actor, "
                f"ranks 0..{len(self.actors) - 1} in order"
            )
        self.specs = list(specs)
        if timeouts is not None:
            self.timeouts = timeouts
        env = _env()
        results = self._gather(
            [a.prepare.remote(s, env) for a, s in zip(self.actors, specs, strict=True)], "prepare"
        )
        raise_failures(results)
        self.nodes = [str(r.get("node", "")) for r in results]
        return results

    def rendezvous(self) -> Rendezvous | None:
        """Where the ranks meet (:mod:`.rendezvous`; None for one rank), from the nodes they reported."""
        if len(self.actors) < 2:
            return None
        if self.cluster.folder is None:
            raise ClusterError("no private folder for the ranks' rendezvous")
        return rendezvous_for(self.nodes, driver_node(), self.cluster.folder, self.id)

    def run(self) -> list[dict[str, Any]]:
        """Every rank's ``run`` (one rendezvous: :meth:`rendezvous`); raises for the first failed rank."""
        rendezvous = self.rendezvous()
        results = self._gather([a.run.remote(rendezvous) for a in self.actors], "run")
        raise_failures(results)
        return results

    def close(self) -> None:
        """Kill every actor and remove the placement group (idempotent)."""
        ray = self.ray
        for a in self.actors:
            with contextlib.suppress(Exception):  # an actor already gone is what we want
                ray.kill(a, no_restart=True)
        self.actors = []
        if self.group is not None:
            with contextlib.suppress(Exception):  # already removed
                ray.util.remove_placement_group(self.group)
            self.group = None


class StartedRayRanks:
    """One launch, started before its specs exist (the driver plans meanwhile).

    The cluster joined (or its head started) and ``world`` actors placed and importing
    (:class:`RayRanks`); :meth:`launch` hands them the specs, prepares and runs them, and tears everything
    down. :meth:`close` tears down a launch never made (the driver's plan failed); both are safe to repeat.
    """

    def __init__(
        self,
        address: str | None,
        world: int,
        *,
        progress: Progress | None = None,
        stage_timeout: float | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        verbose: bool = False,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self.stage_timeout = stage_timeout
        try:
            self.cluster = self._stack.enter_context(
                connect(address, world=world, connect_timeout=connect_timeout, verbose=verbose)
            )
            self.ranks = self._stack.enter_context(RayRanks(self.cluster, world, progress=progress))
        except BaseException:
            self._stack.close()
            raise

    def launch(self, specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        """Prepare then run the ranks (threads capped by the cluster's CPUs per rank); every report."""
        try:
            cpus = self.cluster.cpus
            threads = max(1, int(cpus // max(1, len(specs)))) if cpus else 1
            first = specs[0] if specs else None
            timeouts = stage_timeouts(
                first.model_bytes if first else 0,
                len(specs),
                first.steps if first else 1,
                override=self.stage_timeout,
            )
            self.ranks.prepare(
                [dataclasses.replace(s, threads=min(s.threads, threads)) for s in specs], timeouts
            )
            return self.ranks.run()
        finally:
            self.close()

    def close(self) -> None:
        """Kill the actors, remove the placement group, stop a head started here (idempotent)."""
        self._stack.close()


def run_in_process(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
    """World size 1 without Ray: the one rank prepared and run here (tests, ``--address local``)."""
    if len(specs) != 1:
        raise ClusterError(f"in-process bring-up runs one rank, asked for {len(specs)}")
    rank = Rank(specs[0])
    raise_failures([rank.prepare()])
    result = rank.run(None)
    raise_failures([result])
    return [result]
