"""Load one rank's tensors into memory: plan → covering tiles → verified range reads → numpy arrays.

:func:`load_rank` (one rank) and :func:`load_ranks` (the ranks of one node, one shared read) are the
loader's in-memory face: bring-up calls them and touches no file. The manifest and its tile index are
verified by the registry (:func:`~shardport.registry.trust.resolve.resolve`: signature, tag chain, digests);
placement decides which byte runs each rank needs; :func:`~shardport.loader.read.read_slices` fetches
exactly the tiles covering them and verifies each tile's BLAKE3 before use; every rank's witness rows
are re-decoded from its slices (:mod:`.witness_check`) before anything is returned. The result holds
each tensor piece as a numpy array with the slice metadata that :func:`~.rank_pull.pull_rank` writes
beside it in the rank file (which is written from exactly these arrays and this metadata).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardport.placement import Plan, Topology, plan
from shardport.placement.plan import RankPlan, TensorRead
from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.manifest import Manifest, TensorEntry
from shardport.registry.artifact.refs import Ref
from shardport.registry.artifact.witness_file import ProducerWitness, load_producer
from shardport.registry.checkpoint.analysis import NUMPY_DTYPES
from shardport.registry.errors import UsageError
from shardport.registry.session import Session
from shardport.registry.tiles.grid import plane_layout
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.resolve import Resolved, resolve

from .ledger import ReadLedger
from .read import ReadOptions, read_slices
from .schedule import PlaneSlice
from .witness_check import WitnessCount, check_rank_witnesses


@dataclass(frozen=True)
class RankTensor:
    """One tensor piece a rank holds.

    ``name``: its key in the rank file — the tensor's name, or ``tensor@index`` for a second piece of
    the same tensor; ``array``: the verified bytes, viewed as the manifest dtype in the rank-local
    ``shape`` (a GGUF block type stays raw ``uint8`` blocks, one row per logical row); ``dtype``: the
    manifest dtype (``F16``, ``I32``, ``Q4_1``, …); ``index``: the slice in the tensor's own shape;
    ``weight`` / ``role``: the logical weight it is a plane of, and which plane.
    """

    name: str
    tensor: str
    array: npt.NDArray[Any]
    dtype: str
    index: tuple[tuple[int, int], ...]
    shape: tuple[int, ...]
    weight: str | None
    role: str

    def slice_json(self) -> str:
        """The ``shardport.slice.<name>`` metadata value, exactly as the rank file holds it."""
        return json.dumps(
            {
                "index": [list(r) for r in self.index],
                "dtype": self.dtype,
                "shape": list(self.shape),
                "weight": self.weight,
                "role": self.role,
            }
        )


@dataclass(frozen=True)
class RankTensors:
    """One rank's tensors in memory, witnesses checked, with its plan and the read that fetched them.

    ``ledger``: the read's account — for :func:`load_ranks`, the node's one shared read (the same
    object for every rank of it); ``bytes_assigned``: this rank's bytes; ``witness``: what its witness
    check compared; ``plan_digest``: equal for every rank of one job (ranks can check they agree).
    """

    digest: Digest
    rank: int
    topology: Topology
    tensors: tuple[RankTensor, ...]
    plan: RankPlan
    plan_digest: Digest
    ledger: ReadLedger
    bytes_assigned: int
    witness: WitnessCount

    @property
    def world_size(self) -> int:
        """The topology's number of ranks."""
        return self.topology.world_size

    @property
    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The arrays by name, in plan order (the rank file's tensors)."""
        return {t.name: t.array for t in self.tensors}

    @property
    def metadata(self) -> dict[str, str]:
        """The rank file's metadata: manifest digest, rank, topology, and every piece's slice."""
        meta = {
            "shardport.manifest": self.digest,
            "shardport.rank": str(self.rank),
            "shardport.topology": json.dumps(dataclasses.asdict(self.topology), sort_keys=True),
        }
        for t in self.tensors:
            meta[f"shardport.slice.{t.name}"] = t.slice_json()
        return meta

    def witness_json(self) -> dict[str, int]:
        """The witness counts, as the ledger files carry them."""
        return {
            "witness_cells_checked": self.witness.cells,
            "witness_weights_checked": self.witness.weights,
            "witness_weights_unchecked": len(self.witness.unchecked),
            "producer_rows_checked": self.witness.producer_rows,
        }


@dataclass(frozen=True)
class NodeTensors:
    """The ranks of one node, loaded with one shared read (each byte fetched once for all of them).

    ``seconds_plan`` / ``seconds_read``: wall time to resolve and plan, and to read the slices (the
    witness checks and assembly that follow are in neither).
    """

    digest: Digest
    topology: Topology
    ranks: tuple[RankTensors, ...]
    plan: Plan
    plan_digest: Digest
    ledger: ReadLedger
    seconds_plan: float
    seconds_read: float

    def rank(self, rank: int) -> RankTensors:
        """The tensors of global rank ``rank`` (one of those loaded)."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise UsageError(f"rank {rank}: not loaded (loaded {[r.rank for r in self.ranks]})")


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


def check_ranks(topology: Topology, ranks: Sequence[int]) -> list[int]:
    """``ranks`` sorted, refused unless distinct, at least one, and each a rank of ``topology``."""
    wanted = sorted(set(ranks))
    if not wanted or len(wanted) != len(ranks):
        raise UsageError(f"--ranks {list(ranks)}: expected distinct ranks, at least one")
    for rank in wanted:
        if not 0 <= rank < topology.world_size:
            raise UsageError(f"rank {rank}: expected 0..{topology.world_size - 1} for {topology}")
    return wanted


def load_rank(
    session: Session,
    ref_or_resolved: Ref | Resolved,
    topology: Topology,
    rank: int,
    *,
    policy: str = "align",
    options: ReadOptions | None = None,
) -> RankTensors:
    """Rank ``rank``'s tensors of an artifact under ``topology``, in memory.

    ``ref_or_resolved``: a :class:`~shardport.registry.artifact.refs.Ref` (resolved and verified here through
    ``session``) or what :func:`~shardport.registry.trust.resolve.resolve` already returned for it (the
    verified manifest and its digest; resolve once, load many ranks). ``policy``: the planner's split
    policy; ``options``: read tuning (:class:`~.read.ReadOptions`). Memory: the rank's assigned bytes
    plus, for a tensor assembled from several slices, one more copy of it while it is assembled.
    """
    return load_ranks(session, ref_or_resolved, topology, [rank], policy=policy, options=options).ranks[0]


def load_ranks(
    session: Session,
    ref_or_resolved: Ref | Resolved,
    topology: Topology,
    ranks: Sequence[int],
    *,
    policy: str = "align",
    options: ReadOptions | None = None,
) -> NodeTensors:
    """The tensors of ``ranks`` (the ranks of one node) with one shared, verified read.

    The ranks' slices go to :func:`read_slices` together, so a tile several of them need is read and
    verified once, and a whole tile row of a row-major tensor that the node's ranks split by columns is
    one contiguous read (read amplification per node ≤ 1.05 even where one rank's row pieces are smaller
    than a page). Every rank's witness rows are checked before any rank is returned. Arguments as
    :func:`load_rank`; ``ranks`` must be distinct ranks of ``topology``.
    """
    wanted = check_ranks(topology, ranks)
    t0 = time.perf_counter()
    resolved = ref_or_resolved if isinstance(ref_or_resolved, Resolved) else resolve(session, ref_or_resolved)
    manifest = resolved.manifest
    if not manifest.tensors or not manifest.weights:
        raise UsageError(f"{resolved.ref}: no tensor inventory in the manifest; a per-rank pull needs one")
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
    loaded = []  # every rank's witnesses are checked before any rank is returned
    at = 0
    for rank, reads, groups in per_rank:
        arrays = got.arrays[at : at + sum(len(g) for g in groups)]
        at += len(arrays)
        tensors, witness = _assemble(manifest, entries, reads, groups, arrays, producer)
        loaded.append(
            RankTensors(
                digest=resolved.digest,
                rank=rank,
                topology=topology,
                tensors=tensors,
                plan=the_plan.rank(rank),
                plan_digest=the_plan.decisions_digest(),
                ledger=got.ledger,
                bytes_assigned=sum(a.nbytes for a in arrays),
                witness=witness,
            )
        )
    return NodeTensors(
        digest=resolved.digest,
        topology=topology,
        ranks=tuple(loaded),
        plan=the_plan,
        plan_digest=the_plan.decisions_digest(),
        ledger=got.ledger,
        seconds_plan=planned - t0,
        seconds_read=read_done - planned,
    )


def _assemble(
    manifest: Manifest,
    entries: dict[str, TensorEntry],
    reads: list[TensorRead],
    groups: list[list[PlaneSlice]],
    got: Sequence[npt.NDArray[np.uint8]],
    producer: ProducerWitness | None,
) -> tuple[tuple[RankTensor, ...], WitnessCount]:
    """One rank's tensors from its verified slices, and its witness rows re-decoded."""
    tensors: list[RankTensor] = []
    names: set[str] = set()
    at = 0
    loaded = []
    for read, group in zip(reads, groups, strict=True):
        parts = [got[at + i].reshape(-1) for i in range(len(group))]
        at += len(group)
        data = np.concatenate(parts) if len(parts) != 1 else parts[0]
        loaded.append((read, data))
        name = read.tensor if read.tensor not in names else f"{read.tensor}@{read.index}"
        names.add(read.tensor)
        entry = entries[read.tensor]
        index = tuple((int(a), int(b)) for a, b in read.index)
        array, shape = _as_array(read, entry, data), tuple(read.shape)
        piece = RankTensor(name, read.tensor, array, entry.dtype, index, shape, read.weight, read.role)
        tensors.append(piece)
    witness = check_rank_witnesses(manifest.weights or [], entries, loaded, producer)
    return tuple(tensors), witness
