"""Run the graph across processes on this machine (gloo on 127.0.0.1), without Ray.

The Ray-free way to check a topology: :func:`run_local` spawns ``tp * ep * pp`` processes, each
builds its mesh, takes its shard of a float model (its stage's layers, its ep rank's experts, its tp
slices, as the placement plan assigns them), prefills and greedily decodes, re-checks its KV cache,
and returns what the last stage saw. Several jobs of the same world size share one process group.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardport.placement.topology import Topology, experts_of, layers_of

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
    """The body of one spawned process: join the group, run every job, save each result."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for n, job in enumerate(jobs):
            torch.save(_rank_run(job, rank), Path(out) / f"{n}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(jobs: Sequence[Job]) -> list[list[dict[str, Any]]]:
    """Run ``jobs`` (one world size) in spawned processes; per job, every rank's result."""
    worlds = {j.tp * j.ep * j.pp for j in jobs}
    if len(worlds) != 1:
        raise ValueError(f"jobs of one world size only, found {sorted(worlds)}")
    world = worlds.pop()
    with tempfile.TemporaryDirectory(prefix="graph-") as out:
        env = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            mp.spawn(run_rank, args=(world, free_port(), list(jobs), out), nprocs=world, join=True)
        finally:
            if env is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env
        return [
            [torch.load(Path(out) / f"{n}-{r}.pt", weights_only=False) for r in range(world)]
            for n in range(len(jobs))
        ]
