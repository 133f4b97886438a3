"""The plan: frozen, serializable records of who reads which bytes, and why.

A :class:`Plan` holds one :class:`RankPlan` per rank of one replica (see
:mod:`.topology` for the numbering); each lists :class:`TensorRead` entries — a tensor, the logical
slice of its weight the rank owns, the same range in the tensor's own shape, and the byte pieces
(absolute ``(offset, length)`` in its file) that hold it. Every split decision is recorded as a
:class:`SplitRecord`, including split points moved to group boundaries under policy ``align``.

JSON round-trips exactly (:meth:`Plan.to_json` / :meth:`Plan.from_json`); :meth:`Plan.digest` is the
sha256 of the canonical form (sorted keys, no whitespace).
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from shardport.registry.artifact.digests import Digest
from shardport.registry.artifact.hashing import digest_bytes

from .errors import PlanFormatError, TopologyError
from .inventory import ModelDims
from .topology import Topology

Policy = Literal["align", "refuse"]
#: column: split N; row: split K; vocab: split N (vocabulary rows); kv_heads: split N by kv heads, or
#: one kv head per rank when tp > kv heads; replicate: whole on every rank that needs it.
Rule = Literal["column", "row", "vocab", "kv_heads", "replicate"]
SplitKind = Literal["even", "aligned", "heads_replicated"]
Range = tuple[int, int]
#: ``(offset, length, stride, count)``: ``count`` byte pieces of ``length`` bytes, ``stride`` apart.
Run = tuple[int, int, int, int]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LogicalSlice(_Record):
    """A box of a logical weight: one ``[start, stop)`` per logical axis (``E``, ``N``, ``K``)."""

    axes: tuple[str, ...]
    bounds: tuple[Range, ...]

    def __str__(self) -> str:
        inner = ", ".join(f"{a}={lo}:{hi}" for a, (lo, hi) in zip(self.axes, self.bounds, strict=True))
        return f"[{inner}]"


class TensorRead(_Record):
    """One tensor a rank reads: the slice it owns, and the byte pieces that hold it.

    ``index`` is the slice in the tensor's own shape (``TensorEntry.shape``: int32 containers for packed
    planes, elements for GGUF), ``shape`` the rank-local shape. ``runs`` are its byte pieces as strided
    runs ``(offset, length, stride, count)`` — absolute offsets in ``file``, increasing, no two pieces
    adjacent; :attr:`pieces` expands them to ``(offset, length)`` in row-major order of the local
    tensor. ``uses``: the operator slots it serves (two for a tied embedding on a rank that also
    holds the head).
    """

    tensor: str
    file: str
    weight: str | None
    role: str
    rule: Rule
    split: str | None
    uses: tuple[str, ...]
    slice: LogicalSlice
    index: tuple[Range, ...]
    shape: tuple[int, ...]
    runs: tuple[Run, ...]
    nbytes: int

    @property
    def pieces(self) -> tuple[Range, ...]:
        """The byte pieces ``(offset, length)``, in order (the runs expanded)."""
        return tuple(
            (offset + i * stride, length) for offset, length, stride, count in self.runs for i in range(count)
        )


class SplitRecord(_Record):
    """How one shared dim (a layer's heads, kv heads, intermediate; the vocabulary) is split over tp.

    ``unit`` is the alignment every split point honours (the lcm of ``constraints``); ``ranges`` are
    per tp rank. ``kind``: ``even`` — ``extent / parts`` per rank, a multiple of ``unit``;
    ``aligned`` — policy ``align`` moved the points to multiples of ``unit`` (``detail`` shows the
    arithmetic); ``heads_replicated`` — tp > kv heads, each rank holds one kv head.
    """

    key: str
    axis: str
    extent: int
    parts: int
    unit: int
    constraints: tuple[str, ...]
    members: tuple[str, ...]
    kind: SplitKind
    ranges: tuple[Range, ...]
    detail: str


class RankPlan(_Record):
    """What one rank reads, with its byte totals.

    ``bytes_assigned``: bytes of the pieces it needs; ``bytes_fetched``: bytes read after coalescing
    pieces whose gap is at most the plan's ``max_gap``; ``requests``: ranges fetched;
    ``read_amplification = bytes_fetched / bytes_assigned`` (1.0 for a rank with nothing to read).
    """

    rank: int
    pp_stage: int
    ep_rank: int
    tp_rank: int
    layers: Range
    experts: Range
    reads: tuple[TensorRead, ...]
    bytes_assigned: int
    bytes_fetched: int
    requests: int
    read_amplification: float


class PlanTotals(_Record):
    """Totals over the planned ranks (one replica's, unless the plan is partial).

    ``replication = bytes_assigned / checkpoint_bytes``.
    """

    checkpoint_bytes: int
    bytes_assigned: int
    bytes_fetched: int
    requests: int
    replication: float
    max_read_amplification: float


class Plan(_Record):
    """Per-rank reads for a topology, the split decisions, and totals.

    ``dims``: the model dims planned with; ``stages[s]``: the layers ``[start, stop)`` of pp stage ``s``;
    ``expert_blocks[e]``: the experts of ep rank ``e``; ``splits``: every shared dim's split;
    ``ranks``: the planned ranks of one replica, in rank order (``rank(g)`` for a global rank) — all of
    them, or, when ``partial``, only those asked for (a rank pulling its own bytes plans itself, not the
    whole job); ``totals`` are over the planned ranks; ``max_gap``: the coalescing gap the fetch
    totals assume. Every rank's reads follow from the decisions alone (manifest, topology, policy,
    dims, stages, expert blocks, splits), so :meth:`decisions_digest` is equal for every rank of a job
    however it was planned.
    """

    version: Literal[1] = 1
    topology: Topology
    policy: Policy
    max_gap: int
    dims: ModelDims
    stages: tuple[Range, ...]
    expert_blocks: tuple[Range, ...]
    splits: tuple[SplitRecord, ...]
    ranks: tuple[RankPlan, ...]
    totals: PlanTotals
    partial: bool = False

    def rank(self, global_rank: int) -> RankPlan:
        """The plan of a global rank (data-parallel replicas repeat rank ``global_rank % world_size``)."""
        _, rank = self.topology.replica_of(global_rank)
        found = next((r for r in self.ranks if r.rank == rank), None)
        if found is None:
            planned = ", ".join(str(r.rank) for r in self.ranks)
            raise TopologyError(f"rank {rank} is not in this plan (planned ranks: {planned}); plan it too")
        return found

    def decisions_digest(self) -> Digest:
        """``sha256:<hex>`` of the canonical JSON of the decisions (everything but ranks and totals)."""
        decisions = self.model_dump(mode="json", exclude={"ranks", "totals", "partial"})
        text = json.dumps(decisions, sort_keys=True, separators=(",", ":"))
        return digest_bytes(text.encode())

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | bytes) -> Plan:
        """Parse a plan written by :meth:`to_json`; a malformed one raises :class:`PlanFormatError`."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
            where = ".".join(str(part) for part in first["loc"]) or "document"
            message = f"plan {where}: expected a plan written by shardport, found: {first['msg']}"
            raise PlanFormatError(message) from exc

    def digest(self) -> Digest:
        """``sha256:<hex>`` of :meth:`to_json`."""
        return digest_bytes(self.to_json().encode())
