"""One rank of a bring-up, as a plain class (a Ray actor wraps it; tests run it in-process).

Two calls, so that no rank waits in a collective for a rank that already failed:

1. :meth:`Rank.prepare` — resolve the pinned manifest (trust checked again on the rank), ``load_rank``
   (verified tiles, witness rows), dispatch every quantized linear weight and run its parity ladder,
   then release the loaded planes no operator uses (:mod:`.release`). No collectives. Returns a
   summary or a failure (rank, stage, error type, message, exit code).
2. :meth:`Rank.run` — join the torch.distributed group at the driver's rendezvous
   (:mod:`.rendezvous`; gloo on the CPU, NCCL on a CUDA device: :mod:`.devices`; world 1: none), build
   the graph, warm up, prefill and greedily decode, re-check the KV cache. Returns the rank's report:
   timeline, ledger (host and device memory), device, dispatch traces, ladders, and on the reporting
   rank the logits.

Everything returned is plain data (lists, dicts, numpy arrays), picklable across processes.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardport import ShardportError
from shardport.registry import _failpoints

from .devices import RankDevice

if TYPE_CHECKING:
    from shardport.kernels.capability import ActivationDtype

STAGES = ("resolve", "plan", "fetch", "verify", "repack", "ladder", "release", "warm-up", "first token")


@dataclass(frozen=True)
class RankSpec:
    """What a rank needs to know (picklable): where the store is, what to load, what to run."""

    ref: str
    """The pinned reference ``NAME@sha256:…`` (the driver resolved the tag once)."""
    store: str | None
    home: str | None
    s3_endpoint: str | None
    tp: int
    ep: int
    pp: int
    rank: int
    fallback: str
    prompt: tuple[int, ...]
    steps: int
    threads: int = 1
    cache_tolerance: float = 1e-3
    ladder: str | bool = "sample"
    """The parity ladder's budget: ``full``, ``sample`` or ``off`` (True/False: full/off); see
    :mod:`.ladder_budget`."""
    keep_planes: bool = False
    """Keep the loaded planes after preparation (tests and benches that run ladders again); by default
    the planes no operator uses are released (:mod:`.release`)."""
    model_bytes: int = 0
    """The checkpoint's size in bytes: the driver scales its stage timeouts with it (:mod:`.stage_budget`)."""
    activations: str = "auto"
    """The dtype of the quantized operators' activations, ``float32``, ``bfloat16`` or ``auto`` (by the
    rank's device: :func:`.rank_ops.activations_for`) (``--activations``;
    :func:`~shardport.kernels.dispatch_activations`); the graph around them stays float32."""
    trust: str | None = None
    """The trust policy or public key the driver resolved with (``--trust``; None: the home's policy)."""
    allow_unsigned: bool = False
    """``--allow-unsigned``, as the driver was given it."""


#: What a rank imports before it can prepare and run (torch, the loader, the kernels, the graph): a Ray
#: actor imports them as it starts, while the driver still plans (:func:`warm_imports`).
WARM_MODULES = (
    "torch",
    "torch.distributed",
    "psutil",
    "shardport.loader",
    "shardport.placement",
    "shardport.registry.session",
    "shardport.registry.trust.resolve",
    "shardport.deploy.contract",
    "shardport.deploy.ladder_budget",
    "shardport.deploy.rank_ops",
    "shardport.deploy.release",
    "shardport.deploy.plan_layout",
    "shardport.deploy.graph.dist",
    "shardport.deploy.graph.model",
    "shardport.deploy.graph.reference",
)


def warm_imports() -> None:
    """Import what :meth:`Rank.prepare` and :meth:`Rank.run` need, and build the kernel catalog.

    Needs no spec: a rank process runs it before the driver has planned, so that its seconds of imports
    (torch above all) overlap the driver's resolve and plan instead of following them.
    """
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from shardport.kernels import default_catalog

    default_catalog()


def failure(rank: int, stage: str, exc: BaseException) -> dict[str, Any]:
    """A rank's failure as data: rank, stage, error type, message, exit code and the traceback tail."""
    code = getattr(exc, "exit_code", 1) if isinstance(exc, ShardportError) else 1
    return {
        "rank": rank,
        "stage": stage,
        "kind": type(exc).__name__,
        "message": str(exc),
        "exit_code": int(code),
        "traceback": "".join(traceback.format_exception(exc))[-3000:],
    }


def _rss() -> int:
    """The process's own resident bytes, after handing freed heap back to the system (``malloc_trim``).

    Without the trim, RSS keeps what transient buffers (the ladder's decodes, read staging) used after
    they were freed, and the L5 check would measure the allocator's caching instead of live memory.
    Shared-memory pages (``RssShmem``) are not the rank's own: they are the node's object store, which a
    node's first rank writes the other ranks' slices into (mapped into it until Ray unmaps them), and
    which the node ledger accounts for.
    """
    import ctypes

    import psutil

    from shardport.registry.store.libc import libc_function

    trim = libc_function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])
    if callable(trim):
        trim(0)
    return max(0, int(psutil.Process().memory_info().rss) - _status_bytes("RssShmem"))


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _peak_rss() -> int:
    """The process's peak resident bytes (``VmHWM``; 0 where ``/proc`` has none).

    Not ``ru_maxrss``: Linux carries that across ``fork``/``exec`` from the parent, so a worker started
    by a big process would report the parent's peak; ``VmHWM`` belongs to this process's own memory.
    """
    return _status_bytes("VmHWM")


class Rank:
    """One rank's state between :meth:`prepare` and :meth:`run`."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.stage = "start"
        self.clock: dict[str, float] = {"constructed": time.time()}
        """Wall-clock stamps (``time.time()``, comparable with the driver's on one host): when the rank
        was constructed, began :meth:`prepare`, began its first stage (``resolve``: its imports done) and
        ended :meth:`prepare` (the startup's measure)."""
        self.timeline: dict[str, float] = {}
        self.ledger: dict[str, int] = {}
        self.loaded: Any = None
        self.ops: Any = None
        self.contract: Any = None
        self.manifest: Any = None
        self._session: Any = None
        self._resolved: Any = None
        self.device = RankDevice("cpu")
        self.cuda_visible: list[str] = []
        self.ladder_mode = "off"
        self.activations: ActivationDtype = "float32"
        self.plan_digest: str | None = None
        self.float_buffers: dict[str, Any] | None = None
        self.fault: str | None = None  # a fault armed for the evidence's tests (:mod:`.faults`)
        self.preloaded: Any = None
        """This rank's tensors from its node's one shared read (:meth:`read_node`), when it was one."""
        self.node_read: dict[str, Any] | None = None
        """The node's shared read (ranks, leader, bytes assigned and fetched, requests, seconds)."""
        self.fetched_here = True
        """Whether this process fetched the bytes it holds (False: another rank of its node did)."""

    def _enter(self, stage: str) -> None:
        """Begin ``stage`` (a failure is reported with it); the failpoint ``rank<R>-<stage>`` is here.

        ``SHARDPORT_FAILPOINT=rank1-ladder`` kills rank 1 as it begins its ladder (``:term``: sends it
        SIGTERM; ``:pause``: stops it a minute), for the bring-up fault tests.
        """
        self.stage = stage
        _failpoints.hit(f"rank{self.spec.rank}-{stage}")

    # -- phase 1 ---------------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Resolve, load, dispatch, ladder, release the unused planes; a summary, or ``{"failure": …}``."""
        self.clock["prepare"] = time.time()
        try:
            summary = self._prepare()
            self._release()
            self.clock["prepared"] = time.time()
            return summary
        except BaseException as exc:  # every failure goes back as data, with the stage it happened in
            return {"failure": failure(self.spec.rank, self.stage, exc)}

    def _take_device(self) -> None:
        """The rank's threads, device (a visible GPU, else the CPU) and activation dtype."""
        import torch

        from .devices import rank_device, visible_cuda
        from .rank_ops import activations_for

        torch.set_num_threads(max(1, self.spec.threads))
        self.cuda_visible = visible_cuda()
        self.device = rank_device(self.cuda_visible)
        self.activations = activations_for(self.spec.activations, self.device.kind)
        if self.device.kind == "cuda":  # pragma: no cover - no GPU in CI
            torch.cuda.set_device(self.device.index)
            torch.cuda.reset_peak_memory_stats(self.device.index)

    def _open(self) -> tuple[Any, Any]:
        """The rank's device and session, and the pinned manifest resolved (trust checked again here)."""
        from shardport.registry.artifact.refs import parse_ref
        from shardport.registry.session import Session
        from shardport.registry.trust.resolve import resolve

        from .contract import contract_of

        spec = self.spec
        if self._resolved is not None:  # resolved already (a node's first rank, for its node's read)
            return self._session, self._resolved
        self._take_device()
        if spec.home is not None:
            os.environ["SHARDPORT_HOME"] = spec.home
        self.rss_start = _rss()
        self._enter("resolve")
        self.clock.setdefault("resolve", time.time())  # a rank handed its node's read: when that began
        t0 = time.perf_counter()
        session = Session.open(
            spec.store,
            s3_endpoint=spec.s3_endpoint,
            trust=None if spec.trust is None else Path(spec.trust),
            allow_unsigned=spec.allow_unsigned,
        )
        resolved = resolve(session, parse_ref(spec.ref))
        self.manifest = resolved.manifest
        self.contract = contract_of(resolved.manifest)
        self.timeline["resolve"] = time.perf_counter() - t0
        self._session, self._resolved = session, resolved
        return session, resolved

    def read_node(self, ranks: list[int]) -> dict[int, Any]:
        """Read and verify ``ranks``' union once (this rank is one of them, its node's first).

        Keeps this rank's tensors for :meth:`prepare`; returns every other rank's, to be handed to them
        (``load_ranks``: each tile fetched and verified once for the node). Raises on failure (the
        caller reports it as this rank's, at ``fetch``).
        """
        from shardport.loader import load_ranks
        from shardport.placement import Topology

        spec = self.spec
        began = time.time()
        session, resolved = self._open()
        self._enter("fetch")
        t1 = time.perf_counter()
        node = load_ranks(session, resolved, Topology(tp=spec.tp, ep=spec.ep, pp=spec.pp), ranks)
        wall = time.perf_counter() - t1
        ledger = node.ledger
        self.node_read = {
            "ranks": list(ranks),
            "leader": spec.rank,
            "bytes_assigned": int(ledger.bytes_assigned),
            "bytes_fetched": int(ledger.bytes_fetched),
            "read_amplification": float(ledger.read_amplification),
            "requests": int(ledger.requests),
            "tiles_verified": int(ledger.tiles_verified),
            "seconds": wall,
            "began": began,
        }
        self.preloaded = node.rank(spec.rank)
        return {r.rank: r for r in node.ranks if r.rank != spec.rank}

    def _load(self, session: Any, resolved: Any) -> Any:
        """The rank's verified tensors: from its node's shared read, or read here (one rank per node)."""
        from shardport.loader import load_rank
        from shardport.placement import Topology

        spec = self.spec
        self._enter("fetch")
        t1 = time.perf_counter()
        if self.preloaded is not None:
            loaded, self.preloaded = self.preloaded, None
            wall = float(self.node_read["seconds"]) if self.node_read else 0.0
        else:
            loaded = load_rank(session, resolved, Topology(tp=spec.tp, ep=spec.ep, pp=spec.pp), spec.rank)
            wall = time.perf_counter() - t1
        sec = loaded.ledger.seconds
        self.timeline["plan"] = max(0.0, wall - sec.fetch - sec.verify - sec.materialize)
        self.timeline["fetch"] = sec.fetch
        self.timeline["verify"] = sec.verify + sec.materialize
        return loaded

    def _prepare(self) -> dict[str, Any]:
        from .devices import kernel_device
        from .faults import after_prepare, armed
        from .ladder_budget import ladder_mode
        from .rank_ops import policy_of, prepare_ops, run_ladders

        spec = self.spec
        session, resolved = self._open()
        loaded = self._load(session, resolved)
        self.loaded = loaded
        self._enter("repack")
        t2 = time.perf_counter()
        runtime = resolved.manifest.runtime
        policy = policy_of(spec.fallback)
        weights = {w.name: w for w in resolved.manifest.weights or []}
        self.ops = prepare_ops(
            loaded,
            weights,
            policy=policy,
            required=tuple(runtime.kernels_required),
            preferred=tuple(runtime.kernels_preferred),
            device=kernel_device(self.device),
            activations=self.activations,
        )
        self.timeline["repack"] = time.perf_counter() - t2
        self.fault = after_prepare(armed(spec.rank), self.ops.ops)  # SHARDPORT_FAULT (tests)
        self.ladder_mode = ladder_mode(spec.ladder)
        if self.ladder_mode != "off":
            self._enter("ladder")
            t3 = time.perf_counter()
            run_ladders(loaded, weights, self.ops, mode=self.ladder_mode)
            self.timeline["ladder"] = time.perf_counter() - t3
        ledger = loaded.ledger
        fetched = int(ledger.bytes_fetched) if self.fetched_here else 0  # a node's read: its first rank's
        self.ledger = {
            "bytes_assigned": int(loaded.bytes_assigned),
            "bytes_fetched": fetched,
            "codes_and_qparams": int(loaded.bytes_assigned),
            "prepared_operators": int(self.ops.operator_bytes),
            "float_tensors": int(self.ops.float_bytes),
            "repack_workspace_peak": int(ledger.scratch_bytes + ledger.peak_staging_bytes),
        }
        self.plan_digest = str(loaded.plan_digest)
        return {
            "rank": spec.rank,
            "digest": loaded.digest,
            "plan_digest": loaded.plan_digest,
            "weights": len(self.ops.ops),
            "tiles_verified": int(ledger.tiles_verified),
        }

    def _release(self) -> None:
        """Drop the loaded planes no prepared operator uses (:mod:`.release`); the ledger says what stayed.

        Called once :meth:`_prepare` returned, so that ``self.loaded`` is the last reference to them.
        """
        from .release import PlaneRelease

        self._enter("release")
        release = PlaneRelease(self.loaded, keep=self.ops)
        if not self.spec.keep_planes:
            self.loaded = release.metadata
        kept = release.measure()
        self.ledger.update(kept.ledger())
        self.float_buffers = self._scan_floats()
        self.timeline["release"] = kept.seconds + float(self.float_buffers["seconds"])

    def _scan_floats(self) -> dict[str, Any]:
        """The full-size float buffers alive after preparation (:mod:`.float_scan`; L5 holds the policy).

        Reachable from each prepared operator (attributed to its weight), and from what else the rank
        keeps -- but not its loaded planes, which hold the stored bytes (``keep_planes`` keeps them on
        purpose; the release check counts those no operator uses), nor the manifest, contract, traces
        and ladder records (pydantic records without arrays, thousands of objects at 1 GiB).
        """
        from .float_scan import scan_floats

        # planes; walked per operator; no arrays (the session and the resolved manifest neither)
        skip = ("loaded", "ops", "manifest", "contract", "_session", "_resolved", "preloaded")
        state = {k: v for k, v in vars(self).items() if k not in skip}
        ops = {k: v for k, v in vars(self.ops).items() if k not in ("ops", "traces", "ladders")}
        return scan_floats(self.ops, {"rank": state, "rank operators' container": ops})

    # -- phase 2 ---------------------------------------------------------------------------------
    def run(self, init_method: str | None, store: Callable[[timedelta], Any] | None = None) -> dict[str, Any]:
        """Join the group at ``init_method`` (world 1: none), build the graph, generate.

        ``store``: where ranks on several nodes meet instead (rank 0's TCP store: called with the join's
        timeout, it returns the store or a client connected to it). Returns the rank's report, or
        ``{"failure": …}``.
        """
        import torch.distributed as dist

        world = self.spec.tp * self.spec.ep * self.spec.pp
        joined = False
        timeout = timedelta(seconds=120)
        try:
            self._enter("join")
            if world > 1:
                where: dict[str, Any] = (
                    {"init_method": init_method} if store is None else {"store": store(timeout)}
                )
                dist.init_process_group(
                    self.device.backend, rank=self.spec.rank, world_size=world, timeout=timeout, **where
                )
                joined = True
            return self._run()
        except BaseException as exc:
            return {"failure": failure(self.spec.rank, self.stage, exc)}
        finally:
            if joined and dist.is_initialized():
                dist.destroy_process_group()

    def _prepared_report(self) -> dict[str, Any]:
        """The report's fields fixed once the rank ran: device, timeline, ledgers, dispatch, ladders."""
        return {
            "rank": self.spec.rank,
            "timeline": dict(self.timeline),
            "device": str(self.device),
            "activations": self.activations,
            "backend": self.device.backend,
            "cuda_visible": list(self.cuda_visible),
            "ledger": dict(self.ledger),
            "read_amplification": float(self.loaded.ledger.read_amplification),
            "tiles_verified": int(self.loaded.ledger.tiles_verified),
            "witness": self.loaded.witness_json(),
            "dispatch": [t.model_dump(mode="json") for t in self.ops.traces],
            "ladders": [lad.model_dump(mode="json") for lad in self.ops.ladders],
            "ladder_mode": self.ladder_mode,
            "full_dequant_persistent": self.ops.persistent_full_dequant(),
            "float_buffers": self.float_buffers,
            "plan_digest": self.plan_digest,
            "clock": dict(self.clock),
            "node_read": self.node_read,
        }

    def _run(self) -> dict[str, Any]:
        import torch

        from shardport.placement import Topology
        from shardport.placement.topology import experts_of, layers_of

        from .devices import device_memory, torch_device
        from .faults import after_prefill, armed
        from .graph.collectives import LocalGroup, Mesh
        from .graph.dist import dist_mesh
        from .graph.model import RankModel
        from .graph.reference import check_cache
        from .plan_layout import layout_from_plan
        from .rank_ops import cache_tolerance, rank_weights

        spec, contract = self.spec, self.contract
        topology = Topology(tp=spec.tp, ep=spec.ep, pp=spec.pp)
        at = topology.coords(spec.rank)
        world = topology.world_size
        # warm-up: the process group, the rank's layout and its model over the prepared operators. No
        # warm-up forward: on the direct kernels (GGUF blocks, int4 as loaded) a forward decodes every
        # weight whatever the token count, so one would cost as much as the prefill it precedes; the
        # first token pays its own one-time costs.
        self._enter("warm-up")
        t0 = time.perf_counter()
        mesh = (
            dist_mesh(topology, spec.rank)
            if world > 1
            else Mesh(tp=LocalGroup(), stage=LocalGroup(), pipe=None, first=True, last=True)
        )
        from shardport.placement import plan

        full_plan = plan(self.manifest, topology, ranks=[spec.rank])
        layout = layout_from_plan(full_plan, contract, at.tp_rank)
        layers = layers_of(at.pp_stage, contract.layers, spec.pp)
        experts = experts_of(at.ep_rank, contract.experts, spec.ep) if contract.moe else None
        dev = torch_device(self.device)
        weights = rank_weights(
            contract, self.ops, layers, first=mesh.first, last=mesh.last, experts=experts, device=dev
        )
        model = RankModel(contract, layout, weights, mesh, device=dev)
        self.timeline["warm-up"] = time.perf_counter() - t0
        self._enter("first token")
        t1 = time.perf_counter()
        cache = model.new_cache()
        prompt_logits = model.forward(list(spec.prompt), cache)
        after_prefill(armed(spec.rank), cache.keys)
        rows = [prompt_logits[-1]]
        tokens = [int(torch.argmax(rows[-1]))]
        self.timeline["first token"] = time.perf_counter() - t1
        self._enter("decode")
        t2 = time.perf_counter()
        for _ in range(spec.steps - 1):
            rows.append(model.forward([tokens[-1]], cache)[-1])
            tokens.append(int(torch.argmax(rows[-1])))
        decode_s = time.perf_counter() - t2
        kv_bytes = sum(t.numel() * t.element_size() for d in (cache.keys, cache.values) for t in d.values())
        from .graph.model import Generation

        generation = Generation(prompt_logits, tuple(tokens), torch.stack(rows))
        self._enter("cache check")
        scale = float(prompt_logits.abs().max())
        tolerance = cache_tolerance(self.activations, spec.cache_tolerance, contract.layers, scale)
        checked = check_cache(model, list(spec.prompt), generation, tolerance)
        rss = _rss()
        self.ledger["kv_cache"] = int(kv_bytes)
        self.ledger["host_resident"] = rss
        self.ledger["host_resident_growth"] = max(0, rss - self.rss_start)
        self.ledger["host_peak"] = _peak_rss()
        self.ledger["device_resident"], self.ledger["device_peak"] = device_memory(self.device)
        reports = mesh.last and at.tp_rank == 0 and at.ep_rank == 0
        return {
            **self._prepared_report(),
            "coords": {"tp": at.tp_rank, "ep": at.ep_rank, "pp": at.pp_stage},
            "decode_seconds": decode_s,
            "cache": checked.model_dump(mode="json"),
            "tokens": list(tokens),
            "prompt_logits": np.ascontiguousarray(prompt_logits.numpy()) if reports else None,
            "token_logits": np.ascontiguousarray(generation.token_logits.numpy()) if reports else None,
        }
