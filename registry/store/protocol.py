"""The store protocol: what every backend (a local folder, ``s3://bucket/prefix``) answers.

Callers, the loader included, talk to a store only through :class:`Store`; what differs by backend lives
in the backend (:mod:`.local`, :mod:`.s3`) or is stated here as a capability:

- :attr:`Store.local_root`: the folder of a store on this machine's file system (None on S3), for the
  rules that keep a pull out of its own store and for work files that are renamed into the store;
- :meth:`Store.open_local`: a checked descriptor of a key's file where the store has a ``local_root``
  (no link followed, a regular file: :mod:`.localfiles`);
- :attr:`Store.profile`: how reads from it should be planned (:class:`ReadProfile`).

:func:`open_store` opens the backend that serves a URL; so does ``Store(url)`` (as ``pathlib.Path``
picks its flavour).

Reads distrust the store: no read takes more than the expected size + 1 byte, or for objects of unknown
size (documents, manifests, tile indexes) more than :data:`~.keys.DOCUMENT_MAX` /
:data:`~.keys.BLOB_READ_MAX`; the caller verifies what it read.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from shardport import ShardportError
from shardport.registry.artifact.hashing import digest_bytes, digest_stream
from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, UsageError
from shardport.registry.store.copies import Progress
from shardport.registry.store.keys import BLOB_READ_MAX, blob_key
from shardport.registry.store.retry import RetryPolicy

RangeResult = bytes | BaseException
"""One ranged read's bytes (fewer than asked only where the object ends) or its final exception
(:class:`FileNotFoundError` when the object is missing)."""


class AlreadyExists(Exception):
    """A create-only write found the key already present."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A listed object: its key relative to the store root, size and modification time (UTC)."""

    key: str
    size: int
    mtime: datetime


@dataclass(frozen=True, slots=True)
class ReadProfile:
    """How reads from a backend are planned: what a request costs against what a byte costs.

    ``max_gap``: the most bytes between two wanted ranges read through rather than asked for apart;
    ``depth``: batches in flight by default; ``direct_io``: cold spans may be read with ``O_DIRECT``
    (the backend has local files); ``file_handles``: :meth:`Store.open_local` gives descriptors (the
    store has a :attr:`~Store.local_root`), so readers ``preadv``/map them rather than calling
    :meth:`Store.read_ranges`; ``request_bytes``: what one request costs, in bytes of transfer (its
    latency x the throughput; 0 where a read costs next to nothing, as locally): the fetch planner reads
    a row-major tensor's rows as one range when the gaps between the pieces it needs are smaller, as
    long as that range is at most ``max_amplification`` x those pieces' bytes
    (:func:`shardport.loader.ranges.priced`).
    """

    max_gap: int
    depth: int
    direct_io: bool
    file_handles: bool
    request_bytes: int = 0
    max_amplification: float = 1.0


@contextlib.contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Wrap a backend's own exceptions once, with the object named."""
    try:
        yield
    except (ShardportError, AlreadyExists):
        raise
    except FileNotFoundError as exc:
        raise NotFoundError(f"{what}: not found in the store") from exc
    except Exception as exc:  # the backend's own errors, wrapped once with the object named
        raise StoreError(f"{what}: storage error: {type(exc).__name__}: {exc}") from exc


def backend_class(url: str) -> type[Store]:
    """The backend serving ``url``: ``s3://bucket/prefix``, or a local (``file://``) folder."""
    if url.startswith("s3://"):
        from shardport.registry.store.s3 import S3Store  # loads fsspec: only S3 stores need it

        return S3Store
    if "://" in url and not url.startswith("file://"):
        raise UsageError(f"store URL {url!r}: expected a local directory or s3://bucket/prefix")
    from shardport.registry.store.local import LocalStore

    return LocalStore


def open_store(url: str, *, s3_endpoint: str | None = None, retry: RetryPolicy | None = None) -> Store:
    """Open the store at ``url`` (a local folder, created when missing, or ``s3://bucket/prefix``)."""
    return backend_class(url)(url, s3_endpoint=s3_endpoint, retry=retry)


class Store(abc.ABC):
    """A registry store; ``Store(url)`` is a :class:`~.local.LocalStore` or an :class:`~.s3.S3Store`."""

    url: str
    root: str
    """The backend's name for the store's top (a folder's resolved path; ``bucket/prefix``)."""
    endpoint: str | None
    """The resolved S3 endpoint (None: AWS, or a local store)."""
    retry: RetryPolicy
    """Retries of S3 reads (:mod:`.s3reads`); the loader's ``ReadOptions.retry`` overrides it."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Store:
        """``Store(url, ...)``: the backend serving ``url`` (typed code calls :func:`open_store`).

        A backend class (and ``copy``/``pickle``, which call ``__new__`` without arguments) makes its own.
        """
        if cls is Store:
            cls = backend_class(kwargs.get("url", args[0] if args else ""))
        return super().__new__(cls)

    # ---- what the backend is -------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def profile(self) -> ReadProfile:
        """How reads from this store are planned."""

    @property
    @abc.abstractmethod
    def local_root(self) -> Path | None:
        """The store's folder on this machine's file system (None: not a local store)."""

    # ---- reads -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    @abc.abstractmethod
    def read(self, key: str, *, max_size: int | None = None) -> bytes:
        """Whole content of a small object, refused when over ``max_size`` bytes.

        ``max_size`` defaults to :data:`~.keys.BLOB_READ_MAX` for blobs, :data:`~.keys.DOCUMENT_MAX`
        for the rest (:func:`~.keys.read_limit`).
        """

    def read_many(self, keys: Sequence[str]) -> list[bytes]:
        """:meth:`read` of each key (default limits), in order; a backend may overlap the requests."""
        return [self.read(k) for k in keys]

    @abc.abstractmethod
    def read_ranges(
        self,
        requests: list[tuple[str, int, int]],
        *,
        concurrency: int,
        retry: RetryPolicy | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> tuple[list[RangeResult], int]:
        """``(key, start, end)`` byte ranges, at most ``concurrency`` in flight.

        Returns each range's :data:`RangeResult` in order, and how many requests were retried.
        ``sizes``: the size each key's object must have (as a signed manifest states it); a range of an
        object of another size is a :class:`~.errors.DigestMismatchError` (bytes appended to or cut from
        a blob are seen by a reader of any of its ranges, not only by one that hashes it whole).
        """

    @abc.abstractmethod
    def open_local(self, key: str, *, flags: int = 0) -> int:
        """A descriptor of ``key``'s file, owned by the caller (no link followed, a regular file).

        ``flags`` are added to the open (e.g. ``O_DIRECT``). Only a store with a :attr:`local_root` has
        files (:class:`~.errors.StoreError` otherwise).
        """

    @abc.abstractmethod
    def info(self, key: str) -> ObjectInfo:
        """Size and modification time of ``key``."""

    @abc.abstractmethod
    def listdir(self, key: str) -> list[str]:
        """Names of the immediate children of folder ``key`` (empty when it does not exist)."""

    @abc.abstractmethod
    def walk(self, prefix: str) -> list[ObjectInfo]:
        """Every object under folder ``prefix``, recursively, by key."""

    # ---- writes ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write a small object, replacing any previous one atomically."""

    @abc.abstractmethod
    def create_only(self, key: str, data: bytes) -> None:
        """Write ``key`` only if it does not exist yet; raise :class:`AlreadyExists` otherwise.

        Of many concurrent writers exactly one succeeds, and readers never see a partial object.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (missing is fine)."""

    @abc.abstractmethod
    def delete_tree(self, key: str) -> None:
        """Remove folder ``key`` recursively (missing is fine)."""

    # ---- blobs -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def has_blob(self, digest: str) -> bool:
        """Whether the blob named ``digest`` is present (locally: as a regular file, not a link).

        So a push (or :meth:`put_blob`) replaces a link, a pipe or a device planted in a blob's place.
        """

    @abc.abstractmethod
    def upload_blob(
        self,
        source: Path,
        digest: str,
        progress: Progress | None = None,
        *,
        identity: tuple[int, int, int, int] | None = None,
        move: bool = False,
    ) -> int:
        """Publish file ``source`` as blob ``digest``, verifying the bytes stored are the bytes hashed.

        ``identity`` is the source's :func:`~.copies.file_identity` taken before it was hashed; with it,
        a local upload is a kernel-side copy checked against that identity, without it the copy is
        re-hashed. ``move`` (with ``identity``; for files the caller wrote and no longer needs, e.g. a
        conversion's output in a leased upload folder of the store): a local store renames ``source``
        into place when it is on the store's file system and unchanged since it was hashed, instead of
        copying it. Returns the number of bytes moved. Nothing is published when verification fails.
        """

    @abc.abstractmethod
    def fetch_blob(
        self, digest: str, dest: Path, progress: Progress | None = None, *, max_size: int | None = None
    ) -> tuple[str, int]:
        """Copy blob ``digest`` to the new file ``dest``; return the digest and size of what was written.

        The store is untrusted: the caller compares the result with what it expected. At most
        ``max_size + 1`` bytes are read and written, so an oversized blob (or a local one replaced by a
        link to ``/dev/zero``: refused, see :mod:`.localfiles`) cannot fill the disk.
        """

    @abc.abstractmethod
    def open_blob(self, digest: str, *, max_size: int | None = None) -> IO[bytes]:
        """A binary stream of the blob (verify what you read: the store is untrusted).

        With ``max_size`` the stream ends after ``max_size + 1`` bytes: a reader that got that many
        knows the blob is too large without reading the rest. Locally the blob must be a regular file
        (no link followed; :class:`~.errors.StoreObjectError` otherwise); on S3 each read is a ranged,
        retried GET.
        """

    def read_blob(self, digest: str, *, max_size: int = BLOB_READ_MAX) -> bytes:
        """A small blob's bytes (at most ``max_size``), verified against its name."""
        data = self.read(blob_key(digest), max_size=max_size)
        if digest_bytes(data) != digest:
            raise DigestMismatchError(
                f"blob {digest}: content hashes to {digest_bytes(data)} (corrupt or tampered store)"
            )
        return data

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` as a blob (no-op when present); return its digest."""
        digest = digest_bytes(data)
        if not self.has_blob(digest):
            self.put(blob_key(digest), data)
        return digest

    def digest_blob(self, digest: str, *, max_size: int | None = None) -> tuple[str, int]:
        """The stored blob's digest and size, reading at most ``max_size`` + 1 bytes of it."""
        with self.open_blob(digest, max_size=max_size) as stream, storage_errors(blob_key(digest)):
            return digest_stream(stream, limit=max_size)
