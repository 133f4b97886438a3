"""Pull one rank's bytes: plan → covering tiles → verified range reads → rank-local safetensors.

``registry pull REF DEST --tp N [--ep E] [--pp P] --rank R`` lands here (``--ranks A-B`` for the ranks
of one node, read together: :func:`pull_ranks`). The manifest and its tile
index are verified (signature, tag chain, digests) by the registry; placement decides which byte
runs the rank needs; :func:`~shardport.loader.read.read_slices` fetches exactly the tiles covering
them, verifies each tile's BLAKE3 before use, and the rank's tensors are written from contiguous
buffers to ``DEST/rank-RRRRR-of-WWWWW.safetensors``, reopened and compared, with ``plan.json`` and
``ledger.json`` beside it. Every file is staged under a temporary name inside DEST (never following a
link already there) and all of them are renamed into place only once every one is written and verified
(:class:`~shardport.registry.writers.StagedFiles`); a failed or stopped pull leaves DEST as it was.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.placement import Plan, Topology, plan
from shardport.placement.plan import TensorRead
from shardport.registry import _failpoints
from shardport.registry.analysis import NUMPY_DTYPES
from shardport.registry.destination import rank_pull_destination
from shardport.registry.errors import UsageError
from shardport.registry.manifest import Manifest, TensorEntry
from shardport.registry.refs import Ref
from shardport.registry.resolve import resolve
from shardport.registry.session import Session
from shardport.registry.staging import stop_on_signals
from shardport.registry.tiles import TileIndex, plane_layout
from shardport.registry.witness_file import ProducerWitness, load_producer
from shardport.registry.writers import StagedFiles

from .read import ReadOptions, read_slices
from .schedule import PlaneSlice
from .witness_check import WitnessCount, check_rank_witnesses


@dataclass(frozen=True)
class RankPullResult:
    """What one rank pulled, with its ledger.

    ``plan_digest``: :meth:`~shardport.placement.Plan.decisions_digest` of the plan it read by — equal
    for every rank of one job (each rank plans only itself), so ranks can check they agree.
    """

    digest: str
    rank: int
    world_size: int
    tensors: int
    out: Path
    ledger: dict[str, Any]
    plan_digest: str

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


def slices_of(read: TensorRead, entry: TensorEntry) -> list[PlaneSlice]:
    """The physical rectangles (rows x byte columns) holding ``read``'s pieces, in piece order."""
    layout = plane_layout(entry)
    row_bytes = layout.row_bytes
    out: list[PlaneSlice] = []
    for offset, length, stride, count in read.runs:
        rel = offset - entry.start
        r0, c0 = divmod(rel, row_bytes) if row_bytes else (0, 0)
        if count == 1 and c0 == 0 and row_bytes and length % row_bytes == 0:
            out.append(PlaneSlice(read.tensor, r0, r0 + length // row_bytes, 0, row_bytes))
        elif stride == row_bytes and c0 + length <= row_bytes:
            out.append(PlaneSlice(read.tensor, r0, r0 + count, c0, c0 + length))
        else:  # general case: split every piece at row boundaries
            for k in range(count):
                out += _piece_slices(read.tensor, rel + k * stride, length, row_bytes)
    return out


def _piece_slices(tensor: str, rel: int, length: int, row_bytes: int) -> list[PlaneSlice]:
    out = []
    end = rel + length
    while rel < end:
        row, col = divmod(rel, row_bytes)
        if col == 0 and end - rel >= row_bytes:
            rows = (end - rel) // row_bytes
            out.append(PlaneSlice(tensor, row, row + rows, 0, row_bytes))
            rel += rows * row_bytes
        else:
            stop = min(row_bytes, col + end - rel)
            out.append(PlaneSlice(tensor, row, row + 1, col, stop))
            rel += stop - col
    return out


def _as_array(read: TensorRead, entry: TensorEntry, data: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
    dtype = NUMPY_DTYPES.get(entry.dtype)
    if dtype is None:  # a GGUF block type: keep the raw blocks, one row per logical row
        rows = read.shape[0] if len(read.shape) > 1 else 1
        return data.reshape(rows, -1)
    return data.view(dtype).reshape(read.shape)


def _dedupe(reads: Iterable[TensorRead]) -> list[TensorRead]:
    seen: set[tuple[str, tuple[tuple[int, int], ...]]] = set()
    out = []
    for r in reads:
        key = (r.tensor, tuple(r.index))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def load_tile_index(session: Session, manifest: Manifest) -> TileIndex:
    """The manifest's tile index, its digest checked (the manifest is already verified)."""
    if manifest.tile_index is None:
        raise UsageError("this artifact has no tile index (re-push it with this shardport to get one)")
    raw = session.store.read_blob(manifest.tile_index.digest)
    return TileIndex.from_bytes(raw, source=f"tile index {manifest.tile_index.digest}")


@dataclass(frozen=True)
class NodePullResult:
    """Several ranks of one node pulled with one shared read (each byte read once for all of them)."""

    digest: str
    world_size: int
    ranks: tuple[RankPullResult, ...]
    ledger: dict[str, Any]
    plan_digest: str

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

    The ranks' slices go to :func:`read_slices` together, so a tile several of them need is read and
    verified once, and a whole tile row of a row-major tensor that the node's ranks split by columns is
    one contiguous read (read amplification per node ≤ 1.05 even where one rank's row pieces are smaller
    than a page). Each rank gets its safetensors file and plan as :func:`pull_rank` writes them; the
    shared read's ledger goes to ``node-<first>-<last>.ledger.json`` (one rank: ``rank-R.ledger.json``).
    Every rank's witness rows are checked before any file is written, and no file is renamed into
    place before every rank's files are staged and verified; on any failure (or SIGTERM/SIGHUP/SIGINT)
    the staged files are removed and DEST is as it was. Memory: the node's assigned bytes (what its
    ranks hold anyway) plus, for a tensor assembled from several slices, one more copy of that tensor
    while it is assembled (files are written from the arrays themselves).
    """
    wanted = sorted(set(ranks))
    if not wanted or len(wanted) != len(ranks):
        raise UsageError(f"--ranks {list(ranks)}: expected distinct ranks, at least one")
    for rank in wanted:
        if not 0 <= rank < topology.world_size:
            raise UsageError(f"rank {rank}: expected 0..{topology.world_size - 1} for {topology}")
    where = rank_pull_destination(dest, store_root=session.store.root if session.store.is_local else None)
    with stop_on_signals():
        return _pull_ranks(session, ref, where, topology, wanted, policy=policy, options=options)


def _pull_ranks(
    session: Session,
    ref: Ref,
    dest: Path,
    topology: Topology,
    wanted: list[int],
    *,
    policy: str,
    options: ReadOptions | None,
) -> NodePullResult:
    t0 = time.perf_counter()
    resolved = resolve(session, ref)
    manifest = resolved.manifest
    if not manifest.tensors or not manifest.weights:
        raise UsageError(f"{ref}: no tensor inventory in the manifest; a per-rank pull needs one")
    index = load_tile_index(session, manifest)
    producer = load_producer(manifest, session.store.read_blob)
    the_plan: Plan = plan(manifest, topology, policy=policy, ranks=wanted)  # type: ignore[arg-type]
    planned = time.perf_counter()
    entries = {e.name: e for e in manifest.tensors}
    per_rank: list[tuple[int, list[TensorRead], list[list[PlaneSlice]]]] = []
    flat: list[PlaneSlice] = []
    for rank in wanted:
        reads = _dedupe(the_plan.rank(rank).reads)
        groups = [slices_of(r, entries[r.tensor]) for r in reads]
        per_rank.append((rank, reads, groups))
        flat += [s for group in groups for s in group]
    got = read_slices(
        flat,
        tensors=manifest.tensors,
        files=manifest.files,
        index=index,
        store=session.store,
        options=options,
    )
    read_done = time.perf_counter()
    shared = got.ledger.to_json()
    prepared = []  # every rank's witnesses are checked before any file is written
    at = 0
    for rank, reads, groups in per_rank:
        arrays = got.arrays[at : at + sum(len(g) for g in groups)]
        at += len(arrays)
        prepared.append(
            _prepare_rank(resolved.digest, manifest, entries, topology, rank, reads, groups, arrays, producer)
        )
    with StagedFiles(dest) as staged:  # every file staged and verified before any is published
        results = []
        for rank_data in prepared:
            ledger = shared if len(wanted) == 1 else {"bytes_assigned": rank_data.assigned}
            results.append(_stage_rank(staged, topology, the_plan, rank_data, ledger))
        shared["seconds_plan"] = planned - t0
        shared["seconds_read"] = read_done - planned
        shared["seconds_total"] = time.perf_counter() - t0
        keys = (
            "witness_cells_checked",
            "witness_weights_checked",
            "witness_weights_unchecked",
            "producer_rows_checked",
        )
        for key in keys:
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
        digest=resolved.digest,
        world_size=topology.world_size,
        ranks=tuple(results),
        ledger=shared,
        plan_digest=the_plan.decisions_digest(),
    )


@dataclass(frozen=True)
class _RankData:
    """One rank's tensors and metadata, witnesses checked, ready to write."""

    digest: str
    rank: int
    arrays: dict[str, npt.NDArray[Any]]
    meta: dict[str, str]
    assigned: int
    witness: WitnessCount


def _prepare_rank(
    digest: str,
    manifest: Manifest,
    entries: dict[str, TensorEntry],
    topology: Topology,
    rank: int,
    reads: list[TensorRead],
    groups: list[list[PlaneSlice]],
    got: Sequence[npt.NDArray[np.uint8]],
    producer: ProducerWitness | None = None,
) -> _RankData:
    """Assemble one rank's tensors from its verified slices and re-decode its witness rows."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    meta: dict[str, str] = {
        "shardport.manifest": digest,
        "shardport.rank": str(rank),
        "shardport.topology": json.dumps(dataclasses.asdict(topology), sort_keys=True),
    }
    at = 0
    loaded = []
    for read, group in zip(reads, groups, strict=True):
        parts = [got[at + i].reshape(-1) for i in range(len(group))]
        at += len(group)
        data = np.concatenate(parts) if len(parts) != 1 else parts[0]
        loaded.append((read, data))
        name = read.tensor if read.tensor not in arrays else f"{read.tensor}@{read.index}"
        arrays[name] = _as_array(read, entries[read.tensor], data)
        meta[f"shardport.slice.{name}"] = json.dumps(
            {
                "index": read.index,
                "dtype": entries[read.tensor].dtype,
                "shape": read.shape,
                "weight": read.weight,
                "role": read.role,
            }
        )
    witness = check_rank_witnesses(manifest.weights or [], entries, loaded, producer)
    return _RankData(digest, rank, arrays, meta, sum(a.nbytes for a in got), witness)


def _stage_rank(
    staged: StagedFiles, topology: Topology, the_plan: Plan, data: _RankData, ledger: dict[str, Any]
) -> RankPullResult:
    """Stage one rank's safetensors file (verified by reopening) and its plan."""
    ledger["witness_cells_checked"] = data.witness.cells
    ledger["witness_weights_checked"] = data.witness.weights
    ledger["witness_weights_unchecked"] = len(data.witness.unchecked)
    ledger["producer_rows_checked"] = data.witness.producer_rows
    name = f"rank-{data.rank:05d}-of-{topology.world_size:05d}.safetensors"
    staged.write_safetensors(name, data.arrays, data.meta)
    mine = the_plan.rank(data.rank)
    plan_json = json.dumps(mine.model_dump(mode="json"), sort_keys=True)
    staged.write_text(f"rank-{data.rank:05d}.plan.json", plan_json)
    return RankPullResult(
        digest=data.digest,
        rank=data.rank,
        world_size=topology.world_size,
        tensors=len(data.arrays),
        out=staged.folder / name,
        ledger=ledger,
        plan_digest=the_plan.decisions_digest(),
    )
