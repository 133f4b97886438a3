"""Blob sources: execute a batch's fetch plan into its bands' destinations, locally or over S3.

Modules: :mod:`.protocol` (the :class:`BlobSource` protocol), :mod:`.placing` (destinations, mapped
bands, de-tiling: pure), :mod:`.local` and :mod:`.s3` (the backends), :mod:`._linux` (``cachestat``,
``mincore``, ``O_DIRECT`` arithmetic, anonymous memory). :func:`open_source` picks the backend.

A :class:`Dest` is where a band's bytes go: ``rows`` rows of ``width`` bytes, ``stride`` apart, in a
writable buffer (a slice's result array for a direct band, a page-aligned staging slot otherwise). The
band's bytes come from its file geometry (``origin``, file ``stride``; :class:`~.bands.Band`): a
row-major rectangle, or a tiled tensor's tile rows, each a run of its tiles (:func:`file_view`), which
:func:`place` de-tiles into the destination's rows.

Local (:class:`LocalBlobSource`): one ``os.preadv`` per span scatters the file bytes straight into the
destinations (bridged gap bytes land in a scratch page), at most ``IOV_MAX`` buffers per call; a band
read row by row costs one ``preadv`` per row. A span holding a tiled band is read whole into the
thread's bounce buffer and de-tiled from there (a tiled band read run by run: each run likewise). Each
blob is opened once with ``POSIX_FADV_RANDOM`` so kernel readahead reads nothing nobody asked for. When
a band's bytes are all in the page cache (``mincore`` over the pages its rows touch), the runner instead
copies it out of a read-only mapping of its batch's extents (:meth:`LocalBlobSource.map_cached`, one
mapping per run of nearby bands) chunk by chunk into memory it owns and hashes it there, while the chunk
is still in the CPU cache (a warm strided band costs one strided copy instead of a ``preadv`` per row);
each group is unmapped once its bands are done, so the page cache keeps the pages and the mapped file
pages touched at once stay within one group per worker.

S3 (:class:`S3BlobSource`): spans and runs become the store's ranged reads (``Store.read_ranges``), at
most ``concurrency`` at a time, and the responses are copied (de-tiled for tiled bands) into the
destinations. Storage errors are wrapped once here, naming the file, its blob and the byte range.
Sources reach the store only through its protocol (:mod:`shardport.registry.store.protocol`).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy

from ._linux import SINK_BYTES, anonymous, cached_pages, direct_middle
from .local import LocalBlobSource
from .placing import (
    BandCheck,
    Dest,
    MappedBands,
    TileCheck,
    group_extent,
    map_groups,
    tile_columns,
)
from .protocol import BlobSource
from .s3 import S3BlobSource

__all__ = [
    "SINK_BYTES",
    "BandCheck",
    "BlobSource",
    "Dest",
    "LocalBlobSource",
    "MappedBands",
    "S3BlobSource",
    "TileCheck",
    "anonymous",
    "cached_pages",
    "direct_middle",
    "group_extent",
    "map_groups",
    "open_source",
    "tile_columns",
]


def open_source(
    store: Store,
    blobs: Mapping[str, str],
    *,
    concurrency: int = 16,
    direct: bool = False,
    retry: RetryPolicy | None = None,
    sizes: Mapping[str, int] | None = None,
) -> BlobSource:
    """The source for ``store``: its files' descriptors where it has them, else its ranged reads.

    Descriptors (``profile.file_handles``) are read with ``preadv`` (``direct``: cold spans with
    ``O_DIRECT``).

    ``retry``: the S3 reads' retry policy (None: the store's). ``sizes``: each file's size in the
    manifest; a local blob of another size is refused before any read (a DigestMismatchError).
    """
    if store.profile.file_handles:
        return LocalBlobSource(store, blobs, direct=direct, sizes=sizes)
    return S3BlobSource(store, blobs, concurrency=concurrency, retry=retry)
