"""Ranged blob source (S3): spans and runs as the store's ranged reads, copied (de-tiled) into destinations.

The reads are ``Store.read_ranges`` (on S3: bounded, retried GETs).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from shardport.registry.errors import DigestMismatchError
from shardport.registry.store.keys import blob_key
from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy

from ..bands import Band
from ..errors import BlobNotFoundError, RangeReadError
from ..ranges import FetchPlan
from .placing import Dest, MappedBands, TileCheck, _band_check, file_view, place, place_run
from .protocol import _where


class S3BlobSource:
    """Blobs of a store without local files, read with :meth:`~.Store.read_ranges` (bounded concurrency)."""

    kind = "s3"
    holds_responses = True
    direct_bytes = 0

    def __init__(
        self,
        store: Store,
        blobs: Mapping[str, str],
        *,
        concurrency: int = 16,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._keys = {file: blob_key(digest) for file, digest in blobs.items()}
        self._store = store
        self._concurrency = max(1, concurrency)
        self._retry = retry
        self._lock = threading.Lock()
        self.retries = 0

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        """All of the batch's ranges concurrently, then copy each into its destination.

        Each range is read with bounded, retried GETs
        (:meth:`~shardport.registry.store.protocol.Store.read_ranges`:
        a reset, a truncated body or a 5xx re-requests that range alone; 4xx answers are final; every byte
        is still verified above). Tiled bands are checked in the responses first. Always waits on the
        network (returns True).
        """
        ranges = [(s.file, s.offset, s.length) for s in plan.spans]
        for k in plan.row_bands:
            b = bands[k]
            ranges += [(b.file, b.offset + r * b.stride, b.run_bytes) for r in range(b.runs)]
        if not ranges:
            return False
        try:
            results, retries = self._store.read_ranges(
                [(self._keys[f], o, o + n) for f, o, n in ranges],
                concurrency=self._concurrency,
                retry=self._retry,
            )
        except Exception as exc:  # the backend's own errors, wrapped once
            raise RangeReadError(f"{len(ranges)} ranges from {self._store.url}: {exc}") from exc
        with self._lock:
            self.retries += retries
        got: list[bytes] = []
        for (file, offset, length), data in zip(ranges, results, strict=True):
            where = _where(file, self._keys[file], offset, length)
            if isinstance(data, FileNotFoundError):
                raise BlobNotFoundError(f"{where}: blob not in the store {self._store.url}") from data
            if isinstance(data, BaseException):
                raise RangeReadError(f"{where}: {type(data).__name__}: {data}") from data
            if len(data) != length:  # the reads retried a cut body: the object itself ends there
                raise DigestMismatchError(
                    f"{where}: the blob ends after {len(data)} of these bytes, before the size the manifest "
                    "says (blob truncated; run fsck)"
                )
            got.append(data)
        for span, data in zip(plan.spans, got, strict=False):
            for k, at in span.members:
                place(dests[k].array(), file_view(data, at, bands[k]), bands[k], _band_check(check, k))
        runs = iter(got[len(plan.spans) :])
        for k in plan.row_bands:
            rows, band_check = dests[k].array(), _band_check(check, k)
            for q in range(bands[k].runs):
                place_run(rows, next(runs), bands[k], q, band_check)
        return True

    def map_cached(
        self, bands: Sequence[Band], limit: int, among: Iterable[int] | None = None
    ) -> MappedBands:
        """Nothing: every byte comes over the network."""
        return MappedBands(len(bands))

    def prefetch(self, plan: FetchPlan, bands: Sequence[Band]) -> None:
        """Nothing: the batch's requests go out together when it is fetched."""

    def close(self) -> None:
        """Nothing to release (connections are the store's)."""
