"""The thin Ray layer: one actor per rank in one placement group, torn down whatever happens.

:class:`RayRanks` places one :class:`~.rank.Rank` per bundle (``{"GPU": 1}`` per rank where the
cluster has GPUs for every rank, a share of the CPUs otherwise: :meth:`Cluster.bundle`), calls
``prepare`` on every rank, and only when every rank prepared, ``run`` with the rendezvous port (a TCP
store on 127.0.0.1; each rank joins with gloo, or NCCL on a CUDA device: :mod:`.devices`). A rank
that reports a failure aborts the bring-up with :class:`RankFailedError` (rank, stage, reason);
an actor that dies (or whose answer is lost with its node) is a :class:`RankLostError` naming the rank
and the phase (``prepare`` or ``run``).
:meth:`RayRanks.close` kills every actor and removes the placement group (the ranks destroy their
process groups themselves, or die with them). Each actor is named ``shardport-<bring-up id>-rank-<r>``
(:func:`actor_name`) so that an operator (``ray list actors``) sees which rank of which bring-up a
process is.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .cluster import Cluster, free_port
from .errors import ClusterError, RankFailedError, RankLostError
from .rank import Rank, RankSpec

Progress = Callable[[int, str], None]


class _RankActor:
    """The actor body: a :class:`Rank` and its two calls."""

    def __init__(self, spec: RankSpec) -> None:
        self.rank = Rank(spec)

    def prepare(self) -> dict[str, Any]:
        return self.rank.prepare()

    def run(self, port: int | None) -> dict[str, Any]:
        out = self.rank.run(port)
        if "failure" not in out:  # the GPUs Ray gave this rank (its bundle's), whatever it computes on
            import ray

            out["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        return out

    def pid(self) -> int:
        import os

        return os.getpid()


#: What a rank's process needs from the driver's environment: store credentials and endpoint, the home.
_PASSED_ENV = ("AWS_", "SHARDPORT_")


def _env() -> dict[str, str]:
    """The driver's store credentials and settings, for the rank actors.

    Ray workers do not inherit variables set after the cluster started.
    """
    import os

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
    """The actors of one bring-up on ``cluster``; use as a context manager (teardown on exit)."""

    def __init__(
        self,
        cluster: Cluster,
        specs: Sequence[RankSpec],
        *,
        timeout: float = 600.0,
        progress: Progress | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.specs, self.timeout, self.progress = ray, list(specs), timeout, progress
        self.id = uuid.uuid4().hex[:12]
        world = len(self.specs)
        bundle = cluster.bundle(world)
        self.group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
        self.actors: list[Any] = []
        try:
            ready = self.group.ready()
            done, _ = ray.wait([ready], timeout=min(120.0, timeout))
            if not done:
                raise ClusterError(
                    f"cannot place {world} ranks of {bundle} on the cluster ({cluster.cpus:g} CPUs, "
                    f"{cluster.gpus} GPUs): the placement group did not schedule in time"
                )
            actor = ray.remote(_RankActor)
            for i, spec in enumerate(self.specs):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=self.group, placement_group_bundle_index=i
                )
                self.actors.append(
                    actor.options(
                        name=actor_name(self.id, spec.rank),
                        num_cpus=bundle.get("CPU", 0.0),
                        num_gpus=bundle.get("GPU", 0.0),
                        scheduling_strategy=strategy,
                        max_restarts=0,
                        runtime_env={"env_vars": _env()},
                    ).remote(spec)
                )
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
        deadline = time.monotonic() + self.timeout
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                ranks = sorted(rank_of[r] for r in pending)
                raise RankLostError(
                    f"ranks {ranks}: no answer to {what} within {self.timeout:g} s", rank=ranks[0], stage=what
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
        return [int(p) for p in self.ray.get([a.pid.remote() for a in self.actors], timeout=self.timeout)]

    def prepare(self) -> list[dict[str, Any]]:
        """Every rank's ``prepare``; raises for the first failed rank."""
        results = self._gather([a.prepare.remote() for a in self.actors], "prepare")
        raise_failures(results)
        return results

    def run(self) -> list[dict[str, Any]]:
        """Every rank's ``run`` (one rendezvous on 127.0.0.1); raises for the first failed rank."""
        port = free_port() if len(self.actors) > 1 else None
        results = self._gather([a.run.remote(port) for a in self.actors], "run")
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


def run_in_process(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
    """World size 1 without Ray: the one rank prepared and run here (tests, ``--address local``)."""
    if len(specs) != 1:
        raise ClusterError(f"in-process bring-up runs one rank, asked for {len(specs)}")
    rank = Rank(specs[0])
    raise_failures([rank.prepare()])
    result = rank.run(None)
    raise_failures([result])
    return [result]
