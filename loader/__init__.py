"""shardport.loader: execute a rank's reads — verified range reads of tile-indexed artifacts.

Consumes: the slices a rank needs (:class:`PlaneSlice`: tensor, physical rows, byte columns), the
manifest's ``tensors`` and ``files``, the artifact's tile index
(:class:`~shardport.registry.tiles.TileIndex`) and a :class:`~shardport.registry.store.Store` (local
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
from .read import ReadOptions, SliceRead, read_slices
from .schedule import PlaneSlice, ReadSchedule, schedule_reads

__all__ = [
    "BlobNotFoundError",
    "FetchedRange",
    "IndexMismatchError",
    "LoaderError",
    "PlaneSlice",
    "RangeReadError",
    "ReadLedger",
    "ReadOptions",
    "ReadSchedule",
    "SliceRead",
    "SliceRequestError",
    "StageSeconds",
    "coalesce",
    "read_slices",
    "schedule_reads",
]
