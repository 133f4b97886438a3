"""Run the graph across processes on this machine (gloo on 127.0.0.1), without Ray.

The Ray-free way to check a topology: :func:`run_local` spawns ``tp * ep * pp`` processes, each
builds its mesh, takes its shard of a float model (its stage's layers, its ep rank's experts, its tp
slices, as the placement plan assigns them), prefills and greedily decodes, re-checks its KV cache,
and returns what the last stage saw. Several jobs of the same world size share one process group.
"""

from __future__ import annotations

import multiprocessing
import socket
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shardport.placement.topology import Topology, experts_of, layers_of

from .errors import DeployError, GraphLayoutError
from .graph.dist import dist_mesh
from .graph.model import RankModel
from .graph.reference import FloatModel, check_cache, shard, tp_split


@dataclass(frozen=True, slots=True)
class Job:
    """One run: a float model, a topology, a prompt, greedy steps and the cache check's tolerance."""

    model: FloatModel
    tp: int
    prompt: tuple[int, ...]
    steps: int
    ep: int = 1
    pp: int = 1
    cache_tolerance: float = 1e-4


def _rank_run(job: Job, rank: int) -> dict[str, Any]:
    topology = Topology(tp=job.tp, ep=job.ep, pp=job.pp)
    at = topology.coords(rank)
    contract = job.model.contract
    mesh = dist_mesh(topology, rank)
    split = tp_split(contract, job.tp)
    weights = shard(
        job.model,
        split,
        at.tp_rank,
        layers=layers_of(at.pp_stage, contract.layers, job.pp),
        experts=list(experts_of(at.ep_rank, contract.experts, job.ep)) if contract.moe else None,
        first=mesh.first,
        last=mesh.last,
    )
    model = RankModel(contract, split.layout(at.tp_rank), weights, mesh)
    run = model.generate(job.prompt, job.steps)
    cache = check_cache(model, job.prompt, run, job.cache_tolerance)
    return {"rank": rank, "generation": run, "cache": cache.model_dump()}


def run_rank(rank: int, world: int, port: int, jobs: Sequence[Job], out: str) -> None:
    """The body of one spawned process: join the group, run every job, save each result.

    A failure is written to ``error-<rank>.txt`` (its traceback) before the process exits non-zero.
    """
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        try:
            for n, job in enumerate(jobs):
                torch.save(_rank_run(job, rank), Path(out) / f"{n}-{rank}.pt")
        finally:
            dist.destroy_process_group()
    except BaseException:
        (Path(out) / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(jobs: Sequence[Job], *, timeout: float = 300.0) -> list[list[dict[str, Any]]]:
    """Run ``jobs`` (one world size) in spawned processes; per job, every rank's result."""
    worlds = {j.tp * j.ep * j.pp for j in jobs}
    if len(worlds) != 1:
        raise GraphLayoutError(f"jobs of one world size only, found {sorted(worlds)}")
    world = worlds.pop()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="graph-") as out:
        port = free_port()
        procs = [
            context.Process(target=run_rank, args=(r, world, port, list(jobs), out)) for r in range(world)
        ]
        try:
            for proc in procs:
                proc.start()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(p.is_alive() for p in procs):
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # one rank failed: the others would wait for it in a collective
                time.sleep(0.05)
        finally:
            for proc in procs:  # a rank still running past the deadline (or after a failure) is ended
                if proc.is_alive():
                    proc.kill()
                if proc.pid is not None:
                    proc.join()
        errors = sorted(Path(out).glob("error-*.txt"))
        failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if errors or failed:
            detail = errors[0].read_text()[-4000:] if errors else "no traceback (killed or timed out)"
            raise DeployError(
                f"local ranks {failed} failed (exit codes {[p.exitcode for p in procs]}):\n{detail}"
            )
        return [
            [torch.load(Path(out) / f"{n}-{r}.pt", weights_only=False) for r in range(world)]
            for n in range(len(jobs))
        ]
