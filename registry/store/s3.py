"""The S3 backend: a store at ``s3://bucket/prefix`` (AWS, or any endpoint speaking S3).

Create-only writes are conditional PUTs (``If-None-Match: *``); blobs are published by a streamed
multipart upload that is aborted, never completed, when the bytes do not hash to their name. Object
bodies are read with bounds and bounded retries (:mod:`.s3reads`); listings, ``exists``/``info`` and
writes go through s3fs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import fsspec

from shardport.registry import _failpoints
from shardport.registry.artifact.hashing import CHUNK
from shardport.registry.errors import DigestMismatchError, StoreError
from shardport.registry.store.copies import Progress, copy_hashing
from shardport.registry.store.fsstore import FsStore
from shardport.registry.store.keys import blob_key, read_limit
from shardport.registry.store.protocol import AlreadyExists, RangeResult, ReadProfile, storage_errors
from shardport.registry.store.retry import RetryPolicy
from shardport.registry.store.s3reads import READER_CONFIG, S3Reader

S3_MAX_GAP = 1 << 20
"""Default gap bridged on S3, where a request costs about as much as a megabyte of transfer."""
S3_REQUEST_BYTES = 1 << 20
"""What one GET costs in bytes of transfer. SeaweedFS on 127.0.0.1 (2 shared vCPUs): a GET takes
3.6-4.6 ms more than its bytes at ~600 MB/s (1 vs 4 MiB GETs), 2.2-2.8 MB; AWS S3's first byte comes
after 10-30 ms at ~100 MB/s per connection, 1-3 MB. 1 MiB is the conservative end: a gap under it is
always cheaper read than asked around."""
S3_MAX_AMPLIFICATION = 8.0
"""The most bytes a row-major band may read per byte it needs when its rows are read as one range to
save GETs (:func:`shardport.loader.ranges.priced`): a rank's part of every matrix row is read whole up
to tp 8 (about 8x its bytes), never a wider tensor's thin column."""
S3_PROFILE = ReadProfile(
    max_gap=S3_MAX_GAP,
    depth=4,
    direct_io=False,
    file_handles=False,
    request_bytes=S3_REQUEST_BYTES,
    max_amplification=S3_MAX_AMPLIFICATION,
)
"""Large gaps, 4 batches in flight, every byte by ranged GETs, requests weighed against bytes."""
MANY_READS = 8
"""Whole-object GETs in flight in :meth:`S3Store.read_many` (object-store round trips overlap)."""


def _is_precondition_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is S3's answer to a failed condition.

    Servers differ: 412 PreconditionFailed (AWS, moto, SeaweedFS), 409 ConditionalRequestConflict
    (AWS, for a racing conditional write); s3fs wraps them in OSError with the ClientError chained.
    """
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
        if "pre-conditions you specified did not hold" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class S3Store(FsStore):
    """A store at ``s3://bucket/prefix``.

    The endpoint is ``s3_endpoint``, else ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, else AWS.
    """

    def __init__(self, url: str, *, s3_endpoint: str | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.endpoint = None
        self.retry = retry or RetryPolicy()
        self._reader: S3Reader | None = None
        opts: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
        endpoint = s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
            self.endpoint = endpoint
        self._fs_opts = opts
        self.fs = fsspec.filesystem("s3", **opts)
        self.root = url[len("s3://") :].rstrip("/")

    @property
    def profile(self) -> ReadProfile:
        """:data:`S3_PROFILE`."""
        return S3_PROFILE

    @property
    def local_root(self) -> None:
        """None: the store is not on this machine's file system."""
        return None

    @property
    def reader(self) -> S3Reader:
        """Bounded, retried GETs of this store's objects (its own client: botocore retries off)."""
        if self._reader is None:
            fs = fsspec.filesystem("s3", **self._fs_opts, config_kwargs=READER_CONFIG)
            self._reader = S3Reader(fs, self.retry)
        return self._reader

    # ---- reads -----------------------------------------------------------------------------------
    def open_local(self, key: str, *, flags: int = 0) -> int:
        """Refused: an S3 store has no files here (its :attr:`local_root` is None)."""
        raise StoreError(f"{key}: the store {self.url} has no local files (read it with read_ranges)")

    def read(self, key: str, *, max_size: int | None = None) -> bytes:
        """One bounded, retried GET of the whole object."""
        with storage_errors(key):
            return self.reader.get(self.path(key), read_limit(key, max_size))

    def read_many(self, keys: Sequence[str]) -> list[bytes]:
        """:meth:`read` of each key, :data:`MANY_READS` at a time (round trips overlap)."""
        if len(keys) < 2:
            return [self.read(k) for k in keys]
        with ThreadPoolExecutor(max_workers=MANY_READS) as pool:
            return list(pool.map(self.read, keys))

    def read_ranges(
        self,
        requests: list[tuple[str, int, int]],
        *,
        concurrency: int,
        retry: RetryPolicy | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> tuple[list[RangeResult], int]:
        """Ranged GETs (:meth:`.s3reads.S3Reader.get_ranges`), and the retries made.

        ``sizes``: checked against each answer's ``Content-Range`` total (no extra request).
        """
        paths = [(self.path(k), a, b) for k, a, b in requests]
        totals = {self.path(k): n for k, n in (sizes or {}).items()}
        return self.reader.get_ranges(paths, concurrency=concurrency, policy=retry, sizes=totals)

    def open_blob(self, digest: str, *, max_size: int | None = None) -> IO[bytes]:
        """A stream of ranged, retried GETs of the blob."""
        key = blob_key(digest)
        with storage_errors(key):
            return self.reader.open(self.path(key), None if max_size is None else max_size + 1)  # type: ignore[return-value]

    def has_blob(self, digest: str) -> bool:
        """Whether the blob's object exists."""
        return self.exists(blob_key(digest))

    def fetch_blob(
        self, digest: str, dest: Path, progress: Progress | None = None, *, max_size: int | None = None
    ) -> tuple[str, int]:
        """Stream the blob (at most ``max_size`` + 1 bytes) into the new file ``dest``, hashing."""
        with storage_errors(blob_key(digest)):
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out, self.open_blob(digest, max_size=max_size) as stream:
                return copy_hashing(stream, out, progress, limit=max_size)

    # ---- writes ----------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """One PUT (S3 replaces objects atomically)."""
        with storage_errors(key):
            self.fs.pipe_file(self.path(key), data)

    def create_only(self, key: str, data: bytes) -> None:
        """A conditional PUT (``If-None-Match: *``): a failed condition is :class:`AlreadyExists`."""
        with storage_errors(key):
            try:
                self.fs.pipe_file(self.path(key), data, mode="create")
            except FileExistsError as exc:
                raise AlreadyExists(key) from exc
            except Exception as exc:
                if _is_precondition_failure(exc):
                    raise AlreadyExists(key) from exc
                raise

    def upload_blob(
        self,
        source: Path,
        digest: str,
        progress: Progress | None = None,
        *,
        identity: tuple[int, int, int, int] | None = None,
        move: bool = False,
    ) -> int:
        """A multipart upload hashed as it streams, aborted when the bytes are not ``digest``'s."""
        key = blob_key(digest)
        with storage_errors(f"{source} -> {key}"), open(source, "rb", buffering=0) as src:
            dst = self.fs.open(self.path(key), "wb", block_size=max(CHUNK, 16 * 1024 * 1024))
            try:
                got, size = copy_hashing(src, dst, progress)
                _failpoints.hit("blob-written")
                if got != digest:
                    raise DigestMismatchError(
                        f"{source}: changed while pushing (hashed {digest}, uploaded bytes hash to {got})"
                    )
            except BaseException:
                dst.discard()  # aborts the multipart upload: nothing is published
                dst.closed = True  # discard() leaves the file open; keep fsspec from flushing it later
                raise
            dst.close()
        return size
