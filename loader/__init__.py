"""shardport.loader: a rank's tensors from a verified artifact — in memory, or as rank-local files.

Consumes: a :class:`~shardport.registry.session.Session` (its store: local folder or S3), a ``Ref`` (or
an already-resolved, verified manifest), a :class:`~shardport.placement.Topology` and the ranks to
load. Produces: each rank's tensors as numpy arrays with their slice metadata, its plan and the read's
ledger (:class:`RankTensors`, :class:`NodeTensors`), or the same written to rank-local safetensors
files with ``plan.json`` / ``ledger.json`` beside them (:class:`RankPullResult`, :class:`NodePullResult`).

- :func:`load_rank` / :func:`load_ranks` — one rank, or the ranks of one node with one shared read,
  in memory (what bring-up calls; no file is touched);
- :func:`pull_rank` / :func:`pull_ranks` — thin writers on top: the same tensors, staged, verified
  and published into a folder all together.

Below them, the read itself. Consumes: the slices a rank needs (:class:`PlaneSlice`: tensor, physical
rows, byte columns), the manifest's ``tensors`` and ``files``, the artifact's tile index
(:class:`~shardport.registry.tiles.TileIndex`) and a :class:`~shardport.registry.store.protocol.Store`
(local
folder or S3). Produces: one verified ``uint8`` array per slice and a :class:`ReadLedger` (bytes
assigned / fetched, read amplification, requests, tiles verified, peak staging, seconds per stage).

- :func:`read_slices` — plan, fetch, verify, materialize (:mod:`.read` states the memory bound);
- :func:`schedule_reads` — the pure plan (tiles, batches, coalesced fetch ranges);
- :func:`coalesce` — the project's piece coalescer (from :mod:`shardport.placement`);
- errors: :class:`LoaderError` and its subclasses (:mod:`.errors` draws the tree); a tile that fails
  its hash raises :class:`~shardport.registry.tiles.TileDigestMismatchError`.
"""

from shardport.placement import coalesce

from .errors import BlobNotFoundError, IndexMismatchError, LoaderError, RangeReadError, SliceRequestError
from .ledger import FetchedRange, ReadLedger, StageSeconds
from .rank_load import NodeTensors, RankTensor, RankTensors, load_rank, load_ranks
from .rank_pull import NodePullResult, RankPullResult, pull_rank, pull_ranks
from .read import ReadOptions, SliceRead, read_slices
from .schedule import PlaneSlice, ReadSchedule, schedule_reads

__all__ = [
    "BlobNotFoundError",
    "FetchedRange",
    "IndexMismatchError",
    "LoaderError",
    "NodePullResult",
    "NodeTensors",
    "PlaneSlice",
    "RangeReadError",
    "RankPullResult",
    "RankTensor",
    "RankTensors",
    "ReadLedger",
    "ReadOptions",
    "ReadSchedule",
    "SliceRead",
    "SliceRequestError",
    "StageSeconds",
    "coalesce",
    "load_rank",
    "load_ranks",
    "pull_rank",
    "pull_ranks",
    "read_slices",
    "schedule_reads",
]
