"""Pull one rank's bytes: plan → covering tiles → verified range reads → rank-local safetensors.

``registry pull REF DEST --tp N [--ep E] [--pp P] --rank R`` lands here (``--ranks A-B`` for the ranks
of one node, read together: :func:`pull_ranks`). The manifest and its tile
index are verified (signature, tag chain, digests) by the registry; placement decides which byte
runs the rank needs; :func:`~shardport.loader.read.read_slices` fetches exactly the tiles covering
them, verifies each tile's BLAKE3 before use (all of that is :mod:`.rank_load`, which hands the
tensors over in memory), and the rank's tensors are written from contiguous
buffers to ``DEST/rank-RRRRR-of-WWWWW.safetensors``, reopened and compared, with ``plan.json`` and
``ledger.json`` beside it. Every file is staged under a temporary name inside DEST (never following a
link already there) and all of them are renamed into place only once every one is written and verified
(:class:`~shardport.registry.output.writers.StagedFiles`); a failed or stopped pull leaves DEST as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardport.placement import Topology
from shardport.registry import _failpoints
from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.refs import Ref
from shardport.registry.output.destination import rank_pull_destination
from shardport.registry.output.staging import stop_on_signals
from shardport.registry.output.writers import StagedFiles
from shardport.registry.session import Session

from .rank_load import NodeTensors, RankTensors, check_ranks, load_ranks, load_tile_index, slices_of
from .read import ReadOptions

__all__ = ["NodePullResult", "RankPullResult", "load_tile_index", "pull_rank", "pull_ranks", "slices_of"]


@dataclass(frozen=True)
class RankPullResult:
    """What one rank pulled, with its ledger.

    ``plan_digest``: :meth:`~shardport.placement.Plan.decisions_digest` of the plan it read by — equal
    for every rank of one job (each rank plans only itself), so ranks can check they agree.
    """

    digest: Digest
    rank: int
    world_size: int
    tensors: int
    out: Path
    ledger: dict[str, Any]
    plan_digest: Digest

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form (ledger figures at the top level)."""
        return {
            "digest": self.digest,
            "rank": self.rank,
            "world_size": self.world_size,
            "tensors": self.tensors,
            "out": str(self.out),
            "plan_digest": self.plan_digest,
            "bytes_assigned": self.ledger.get("bytes_assigned"),
            "bytes_fetched": self.ledger.get("bytes_fetched"),
            "read_amplification": self.ledger.get("read_amplification"),
            "requests": self.ledger.get("requests"),
            "ledger": self.ledger,
        }


@dataclass(frozen=True)
class NodePullResult:
    """Several ranks of one node pulled with one shared read (each byte read once for all of them)."""

    digest: Digest
    world_size: int
    ranks: tuple[RankPullResult, ...]
    ledger: dict[str, Any]
    plan_digest: Digest

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: node totals at the top level, each rank's file and assigned bytes."""
        return {
            "digest": self.digest,
            "world_size": self.world_size,
            "node_ranks": [r.rank for r in self.ranks],
            "plan_digest": self.plan_digest,
            "bytes_assigned": self.ledger.get("bytes_assigned"),
            "bytes_fetched": self.ledger.get("bytes_fetched"),
            "read_amplification": self.ledger.get("read_amplification"),
            "requests": self.ledger.get("requests"),
            "ranks": [
                {
                    "rank": r.rank,
                    "out": str(r.out),
                    "tensors": r.tensors,
                    "bytes_assigned": r.ledger["bytes_assigned"],
                }
                for r in self.ranks
            ],
            "ledger": self.ledger,
        }


def pull_rank(
    session: Session,
    ref: Ref,
    dest: Path,
    topology: Topology,
    rank: int,
    *,
    policy: str = "align",
    options: ReadOptions | None = None,
) -> RankPullResult:
    """Pull rank ``rank``'s bytes of ``ref`` under ``topology`` into ``dest``."""
    node = pull_ranks(session, ref, dest, topology, [rank], policy=policy, options=options)
    return node.ranks[0]


def pull_ranks(
    session: Session,
    ref: Ref,
    dest: Path,
    topology: Topology,
    ranks: Sequence[int],
    *,
    policy: str = "align",
    options: ReadOptions | None = None,
) -> NodePullResult:
    """Pull the bytes of ``ranks`` (the ranks of one node) with one shared, verified read.

    The ranks are loaded by :func:`~.rank_load.load_ranks` (a tile several of them need is read and
    verified once; every rank's witness rows are checked before any file is written). Each rank gets
    its safetensors file and plan as :func:`pull_rank` writes them; the shared read's ledger goes to
    ``node-<first>-<last>.ledger.json`` (one rank: ``rank-R.ledger.json``). No file is renamed into
    place before every rank's files are staged and verified; on any failure (or SIGTERM/SIGHUP/SIGINT)
    the staged files are removed and DEST is as it was. Memory: the node's assigned bytes (what its
    ranks hold anyway) plus, for a tensor assembled from several slices, one more copy of that tensor
    while it is assembled (files are written from the arrays themselves).
    """
    wanted = check_ranks(topology, ranks)
    where = rank_pull_destination(dest, store_root=session.store.local_root)
    with stop_on_signals():
        t0 = time.perf_counter()
        node = load_ranks(session, ref, topology, wanted, policy=policy, options=options)
        return _write_ranks(where, node, t0)


def _write_ranks(dest: Path, node: NodeTensors, t0: float) -> NodePullResult:
    """Stage every rank's files and the node's ledger in ``dest``, verify them, then publish them all."""
    wanted = [r.rank for r in node.ranks]
    shared = node.ledger.to_json()
    with StagedFiles(dest) as staged:  # every file staged and verified before any is published
        results = []
        for loaded in node.ranks:
            ledger = shared if len(wanted) == 1 else {"bytes_assigned": loaded.bytes_assigned}
            ledger.update(loaded.witness_json())
            results.append(_stage_rank(staged, loaded, ledger))
        shared["seconds_plan"] = node.seconds_plan
        shared["seconds_read"] = node.seconds_read
        shared["seconds_total"] = time.perf_counter() - t0
        for key in node.ranks[0].witness_json():  # one rank: its own counts; a node: their sums
            shared[key] = sum(r.ledger[key] for r in results)
        if len(wanted) == 1:
            name = f"rank-{wanted[0]:05d}.ledger.json"
        else:
            shared["node_ranks"] = wanted
            name = f"node-{wanted[0]:05d}-{wanted[-1]:05d}.ledger.json"
        staged.write_text(name, json.dumps(shared, sort_keys=True, indent=1))
        _failpoints.hit("rank-files-staged")
        staged.publish()
    return NodePullResult(
        digest=node.digest,
        world_size=node.topology.world_size,
        ranks=tuple(results),
        ledger=shared,
        plan_digest=node.plan_digest,
    )


def _stage_rank(staged: StagedFiles, loaded: RankTensors, ledger: dict[str, Any]) -> RankPullResult:
    """Stage one rank's safetensors file (verified by reopening) and its plan."""
    name = f"rank-{loaded.rank:05d}-of-{loaded.world_size:05d}.safetensors"
    staged.write_safetensors(name, loaded.arrays, loaded.metadata)
    plan_json = json.dumps(loaded.plan.model_dump(mode="json"), sort_keys=True)
    staged.write_text(f"rank-{loaded.rank:05d}.plan.json", plan_json)
    return RankPullResult(
        digest=loaded.digest,
        rank=loaded.rank,
        world_size=loaded.world_size,
        tensors=len(loaded.tensors),
        out=staged.folder / name,
        ledger=ledger,
        plan_digest=loaded.plan_digest,
    )
