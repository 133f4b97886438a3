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
from datetime import timedelta
from typing import Any

from shardport.placement import Topology
from shardport.placement.nodes import NodePlacement, place_on_nodes

from .cluster import CONNECT_TIMEOUT_S, Cluster, alive_nodes, connect, driver_node, node_alive
from .errors import ClusterError, RankFailedError, RankLostError
from .rank import Rank, RankSpec, failure, warm_imports
from .rendezvous import Rendezvous, local_rendezvous, on_driver_node, socket_env, store_rendezvous
from .stage_budget import PLACEMENT_S, StageTimeouts, stage_timeouts

Progress = Callable[[int, str], None]
#: How long a lost rank's node may take to be counted dead before the loss is reported as the rank's alone.
NODE_GONE_S = 5.0


def _own_copy(ref: Any) -> Any:
    """A rank's tensors taken from the object store into this process (writable arrays of its own).

    One memory copy per rank of its own slice; the store's object is released when the last rank took
    its copy. The rank's memory ledger and the release of its unused planes stay its own.
    """
    import ray

    tensors = ray.get(ref)
    own = tuple(dataclasses.replace(t, array=t.array.copy()) for t in tensors.tensors)
    return dataclasses.replace(tensors, tensors=own)


def _node_address() -> str:
    """The address Ray knows this process's node by."""
    import ray

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


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
        self.store: Any = None

    def warm(self) -> None:
        """Import what a rank needs (no spec yet); a failure is the rank's, reported by :meth:`prepare`."""
        try:
            warm_imports()
        except BaseException as exc:  # an import that fails here fails the rank's prepare, as data
            self.warm_error = exc
        self.clock["imported"] = time.time()

    def _rank(self, spec: RankSpec, env: dict[str, str]) -> Rank:
        if self.rank is None:
            os.environ.update(env)
            self.rank = Rank(spec)
            self.rank.clock.update(self.clock)
        return self.rank

    def read_node(self, spec: RankSpec, env: dict[str, str], ranks: list[int]) -> dict[str, Any]:
        """The first rank of a node: read the node's union once, the other ranks' tensors put in the store.

        They are handed to those ranks with :meth:`prepare`; a failure is this rank's, at ``fetch``.
        """
        import ray

        rank = self._rank(spec, env)
        if self.warm_error is not None:
            return {"failure": failure(spec.rank, "start", self.warm_error)}
        try:
            others = rank.read_node(ranks)
            refs = {r: [ray.put(tensors)] for r, tensors in others.items()}  # in a list: not resolved
            del others
            return {"refs": refs, "node_read": rank.node_read}
        except BaseException as exc:  # reported as data, with the stage it happened in
            out = failure(spec.rank, rank.stage, exc)
            out["message"] = f"rank {spec.rank}, reading its node's union for ranks {ranks}: {out['message']}"
            return {"failure": out}

    def prepare(
        self, spec: RankSpec, env: dict[str, str], shared: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        rank = self._rank(spec, env)
        if self.warm_error is not None:
            return {"failure": failure(spec.rank, "start", self.warm_error)}
        if shared is not None:  # this rank's tensors from its node's read: copied out of the object store
            try:
                rank.preloaded = _own_copy(shared["tensors"][0])
            except BaseException as exc:  # the object went with the node's first rank
                return {"failure": failure(spec.rank, "fetch", exc)}
            rank.node_read, rank.fetched_here = shared["node_read"], False
            rank.clock["resolve"] = float(shared["node_read"]["began"])  # its first stage: the node's read
        out = rank.prepare()
        out["node"] = self.node()  # where this rank runs (rendezvous)
        return out

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def open_store(self, world: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0 of ranks on several nodes: a TCP store on this node's Ray address, a port picked here."""
        from torch._C._distributed_c10d import TCPStore

        host = _node_address()
        self.store = TCPStore(
            host, 0, world, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return host, int(self.store.port)

    def run(self, rendezvous: Rendezvous | None) -> dict[str, Any]:
        if self.rank is None:
            raise ClusterError("run before prepare")
        import ray

        address = _node_address()
        store = None
        if rendezvous is not None:
            os.environ.update(rendezvous.env)
            if rendezvous.store is not None:
                os.environ.update(socket_env(address, dict(os.environ)))
                store = self._store(rendezvous.store)
        out = self.rank.run(None if rendezvous is None else rendezvous.init_method, store=store)
        if "failure" not in out:  # the GPUs Ray gave this rank (its bundle's), whatever it computes on
            out["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
            out["node"] = {"id": self.node(), "address": address}
        return out

    def _store(self, where: tuple[str, int]) -> Callable[[timedelta], Any]:
        """Rank 0's own store, or a client of it (connected as the rank joins: a failure is its join's)."""
        if self.store is not None:
            master = self.store
            return lambda _timeout: master
        assert self.rank is not None
        spec = self.rank.spec
        return _StoreClient(where, spec.tp * spec.ep * spec.pp)

    def pid(self) -> int:
        return os.getpid()


@dataclasses.dataclass(frozen=True)
class _StoreClient:
    """Where a rank other than 0 finds rank 0's TCP store (connected by the rank as it joins)."""

    where: tuple[str, int]
    world: int

    def __call__(self, timeout: timedelta) -> Any:
        from torch._C._distributed_c10d import TCPStore

        host, port = self.where
        return TCPStore(host, port, self.world, is_master=False, timeout=timeout)


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
        topology: Topology | int,
        *,
        timeouts: StageTimeouts | None = None,
        progress: Progress | None = None,
    ) -> None:
        import ray

        if isinstance(topology, int):  # a world of single-rank units (tests that need no tp groups)
            topology = Topology(tp=1, pp=max(1, topology))
        world = topology.world_size
        self.ray, self.cluster, self.progress = ray, cluster, progress
        self.timeouts = timeouts or stage_timeouts(0, world, 1)
        self.nodes: list[str] = []
        self.specs: list[RankSpec] = []
        self.id = uuid.uuid4().hex[:12]
        self.bundle = cluster.bundle(world)
        self.placement: NodePlacement = place_on_nodes(
            topology,
            alive_nodes(),
            use_gpus="GPU" in self.bundle,
            cpu_share=self.bundle.get("CPU", 1.0) or 1.0,
            first=driver_node(),
        )
        self.group: Any = None
        self.actors: list[Any] = []
        try:
            self.group = self._place_group()
            for rank in range(world):
                self.actors.append(self._start_actor(rank))
                if progress is not None:
                    progress(rank, "started")
        except BaseException:
            self.close()
            raise

    def _place_group(self) -> Any:
        """One placement group, one bundle per node used (its ranks' resources), pinned to that node."""
        ray = self.ray
        from ray.util.placement_group import placement_group

        bundles = [
            {k: v * len(g.ranks) for k, v in self.bundle.items() if v > 0} for g in self.placement.groups
        ]
        selectors = [{"ray.io/node-id": g.node_id} for g in self.placement.groups]
        group = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors)
        done, _ = ray.wait([group.ready()], timeout=PLACEMENT_S)
        if not done:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
            where = "; ".join(
                f"{g.address} ranks {list(g.ranks)}: {b}"
                for g, b in zip(self.placement.groups, bundles, strict=True)
            )
            raise ClusterError(
                f"cannot place {self.placement.topology.world_size} ranks on the cluster "
                f"({self.cluster.cpus:g} CPUs, {self.cluster.gpus} GPUs; per node: {where}): the placement "
                "group did not schedule "
                f"within {PLACEMENT_S:g} s (resources held by other jobs?)"
            )
        return group

    def _start_actor(self, rank: int) -> Any:
        """Rank ``rank``'s actor in its node's bundle, importing at once (prepare queues behind)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index = next(i for i, g in enumerate(self.placement.groups) if rank in g.ranks)
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=index
        )
        handle: Any = (
            self.ray.remote(_RankActor)
            .options(
                name=actor_name(self.id, rank),
                num_cpus=self.bundle.get("CPU", 0.0),
                num_gpus=self.bundle.get("GPU", 0.0),
                scheduling_strategy=strategy,
                max_restarts=0,
            )
            .remote()
        )
        handle.warm.remote()
        return handle

    def __enter__(self) -> RayRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gather(self, refs: list[Any], what: str, ranks: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """Every rank's answer, in rank order; the first failure or death raises at once.

        Ranks are waited on together, so a rank that failed or died is seen while the others may still
        wait for it in a collective; raising here lets :meth:`close` end them instead of their timeout.
        """
        ray = self.ray
        order = [spec.rank for spec in self.specs] if ranks is None else list(ranks)
        rank_of = {ref: rank for rank, ref in zip(order, refs, strict=True)}
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
                    raise self._lost(rank, what, f"its actor died during {what}", exc) from exc
                except ray.exceptions.ObjectLostError as exc:  # its answer went with its node
                    raise self._lost(rank, what, f"its answer to {what} was lost with its node", exc) from exc
                raise_failures([results[rank]])
                if self.progress is not None:
                    self.progress(rank, f"{what} done")
        return [results[rank] for rank in order]

    def _lost(self, rank: int, what: str, how: str, exc: BaseException) -> RankLostError:
        """The error for a rank lost during ``what``: its node and every rank on it, when the node is gone.

        Gone: Ray no longer counts it alive within :data:`NODE_GONE_S`; else the rank alone is named.
        """
        group = self.placement.node_of(rank)
        deadline = time.monotonic() + NODE_GONE_S
        gone = False
        with contextlib.suppress(Exception):  # a failing query leaves the rank-level message
            while not (gone := not node_alive(group.node_id)) and time.monotonic() < deadline:
                time.sleep(0.5)
        if gone:
            message = (
                f"node {group.node_id[:12]} ({group.address}) was lost during {what}: ranks "
                f"{list(group.ranks)} ran on it (rank {rank}: {how}, {type(exc).__name__}); the bring-up "
                "was aborted and every rank on the surviving nodes torn down"
            )
        else:
            message = (
                f"rank {rank}: {how} ({type(exc).__name__}; node {group.node_id[:12]} at {group.address}); "
                "the bring-up was aborted and every other rank torn down"
            )
        lost = RankLostError(message, rank=rank, stage=what)
        lost.node = (
            {"id": group.node_id, "address": group.address, "ranks": list(group.ranks)} if gone else None
        )
        return lost

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
        shared = self._read_nodes(env)
        results = self._gather(
            [a.prepare.remote(s, env, shared.get(s.rank)) for a, s in zip(self.actors, specs, strict=True)],
            "prepare",
        )
        del shared
        raise_failures(results)
        self.nodes = [str(r.get("node", "")) for r in results]
        planned = self.placement.nodes
        moved = [r for r, (got, want) in enumerate(zip(self.nodes, planned, strict=True)) if got != want]
        if moved:
            raise ClusterError(
                f"ranks {moved} run on other nodes than placed (reported "
                f"{[self.nodes[r][:12] for r in moved]}, placed on {[planned[r][:12] for r in moved]}): "
                "the placement group was not honoured"
            )
        return results

    def _read_nodes(self, env: dict[str, str]) -> dict[int, dict[str, Any]]:
        """Each node with several ranks reads their union once, by its first rank (in parallel per node).

        Returns, for every other rank of those nodes, what :meth:`_RankActor.prepare` takes from the
        read (its tensors' object in the store, and the node's read account).
        """
        leaders = [g for g in self.placement.groups if len(g.ranks) > 1]
        if not leaders:
            return {}
        refs = [
            self.actors[g.ranks[0]].read_node.remote(self.specs[g.ranks[0]], env, list(g.ranks))
            for g in leaders
        ]
        answers = self._gather(refs, "fetch", ranks=[g.ranks[0] for g in leaders])
        shared: dict[int, dict[str, Any]] = {}
        for answer in answers:
            for rank, tensors in answer["refs"].items():
                shared[int(rank)] = {"tensors": tensors, "node_read": answer["node_read"]}
        return shared

    def rendezvous(self) -> Rendezvous | None:
        """Where the ranks meet (:mod:`.rendezvous`; None for one rank), from the nodes they reported.

        Every rank on the driver's node: a file store in the private folder, loopback sockets. Ranks on
        several nodes (a cluster joined with ``--address``): rank 0's TCP store on its node's address.
        """
        if len(self.actors) < 2:
            return None
        if on_driver_node(self.nodes, driver_node()):
            if self.cluster.folder is None:
                raise ClusterError("no private folder for the ranks' rendezvous")
            return local_rendezvous(self.cluster.folder, self.id)
        if self.cluster.address is None:  # pragma: no cover - an embedded head is one node on loopback
            raise ClusterError(
                "ranks were placed on another node than the driver's without --address: the embedded head "
                "is one node on loopback, and a cross-node rendezvous is opened only on a joined cluster"
            )
        world = len(self.actors)
        ref = self.actors[0].open_store.remote(world, self.timeouts.of("run"))
        host, port = self._gather_one(ref, 0, "rendezvous")
        return store_rendezvous(host, port)

    def _gather_one(self, ref: Any, rank: int, what: str) -> Any:
        """One actor's answer within the stage's timeout (a lost actor is a :class:`RankLostError`)."""
        ray = self.ray
        try:
            return ray.get(ref, timeout=self.timeouts.of(what))
        except ray.exceptions.GetTimeoutError as exc:
            raise RankLostError(f"rank {rank}: no answer to {what}", rank=rank, stage=what) from exc
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            raise self._lost(rank, what, f"its actor died during {what}", exc) from exc

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
        topology: Topology,
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
                connect(address, world=topology.world_size, connect_timeout=connect_timeout, verbose=verbose)
            )
            self.ranks = self._stack.enter_context(RayRanks(self.cluster, topology, progress=progress))
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
