"""The object store: one fsspec code path for a local directory and ``s3://bucket/prefix``.

(A local store answers the same fsspec calls with :class:`~shardport.registry.store.localfs.LocalFiles`,
so that a local command does not import fsspec.)

Layout (see DESIGN.md)::

    blobs/sha256/<hex>                               immutable, content-addressed
    repos/<name>/tags/<tag>/<version:012d>.json      signed tag documents, create-only
    repos/<name>/referrers/<manifest-hex>/<blob-hex> attachments (signatures, evidence)
    uploads/<id>/                                    staging and leases of pushes in flight

Only two operations differ by backend: *create-only* writes (``os.link`` of a finished temporary file
locally, ``If-None-Match: *`` on S3) and *blob publication* (temporary file + rename locally; on S3 a
streamed multipart upload that is aborted, never completed, when the bytes do not hash to their name).

Reads distrust the store's own files: locally every file is opened without following links and must be
a regular file (:mod:`.storefiles`); on S3 object bodies are read with bounds and bounded retries
(:mod:`.s3reads`). No read takes more than the expected size + 1 byte, or for objects of unknown size
(documents, manifests, tile indexes) more than :data:`DOCUMENT_MAX` / :data:`BLOB_READ_MAX`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from shardport import ShardportError
from shardport.registry import _failpoints
from shardport.registry.artifact.hashing import CHUNK, digest_bytes, digest_stream, hex_of
from shardport.registry.errors import (
    DigestMismatchError,
    NotFoundError,
    StoreError,
    UsageError,
)
from shardport.registry.store.localfiles import open_bounded, open_store_file, read_bounded
from shardport.registry.store.localfs import LocalFiles
from shardport.registry.store.retry import RetryPolicy

if TYPE_CHECKING:  # S3 readers load fsspec: only S3 stores import them
    from shardport.registry.store.s3reads import S3Reader

Progress = Callable[[int], None]
DOCUMENT_MAX = 16 << 20
"""Most bytes read of a store object that is not a blob (tag documents, referrer links, leases)."""
BLOB_READ_MAX = 1 << 30
"""Most bytes of a blob read whole into memory without a known size (manifests, tile indexes,
signatures): :meth:`Store.read_blob` refuses a larger one."""


class AlreadyExists(Exception):
    """A create-only write found the key already present."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A listed object: its key relative to the store root, size and modification time (UTC)."""

    key: str
    size: int
    mtime: datetime


def blob_key(digest: str) -> str:
    """Key of the blob named ``digest``."""
    return f"blobs/sha256/{hex_of(digest)}"


def tag_dir(name: str, tag: str) -> str:
    """Folder holding a tag's documents."""
    return f"repos/{name}/tags/{tag}"


def tag_key(name: str, tag: str, version: int) -> str:
    """Key of one tag document."""
    return f"{tag_dir(name, tag)}/{version:012d}.json"


def referrer_key(name: str, manifest: str, blob: str) -> str:
    """Key that attaches ``blob`` to ``manifest`` in repository ``name``."""
    return f"repos/{name}/referrers/{hex_of(manifest)}/{hex_of(blob)}"


@contextlib.contextmanager
def _io(what: str) -> Iterator[None]:
    """Wrap backend exceptions once, with the object named."""
    try:
        yield
    except (ShardportError, AlreadyExists):
        raise
    except FileNotFoundError as exc:
        raise NotFoundError(f"{what}: not found in the store") from exc
    except Exception as exc:  # the backend's own errors, wrapped once with the object named
        raise StoreError(f"{what}: storage error: {type(exc).__name__}: {exc}") from exc


def file_identity(path: Path) -> tuple[int, int, int, int]:
    """(inode, size, mtime_ns, ctime_ns): changes whenever the file's content is written."""
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _kernel_copy(src: Path, dst: Path, progress: Progress | None, *, exclusive: bool = False) -> int:
    """Copy ``src`` to a new file ``dst`` inside the kernel (copy_file_range); return bytes copied."""
    with open(src, "rb", buffering=0) as fin:
        return _kernel_copy_fd(fin.fileno(), dst, progress, exclusive=exclusive)


def _kernel_copy_fd(
    src: int, dst: Path, progress: Progress | None, *, exclusive: bool = False, limit: int | None = None
) -> int:
    """Copy from descriptor ``src`` to a new file ``dst``, at most ``limit`` + 1 bytes (None: all)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if exclusive else os.O_TRUNC)
    total = 0
    fd = os.open(dst, flags, 0o644)
    try:
        while True:
            step = CHUNK if limit is None else min(CHUNK, limit + 1 - total)
            if step <= 0:
                break
            try:
                n = os.copy_file_range(src, fd, step)
            except OSError:  # filesystems without copy_file_range: fall back to sendfile
                n = os.sendfile(fd, src, None, step)
            if n == 0:
                break
            total += n
            if progress:
                progress(n)
    finally:
        os.close(fd)
    return total


def _digest_path(path: Path) -> tuple[str, int]:
    from shardport.registry.artifact.hashing import digest_file

    return digest_file(path)


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


class Store:
    """A registry store rooted at a local directory or an ``s3://bucket/prefix`` URL."""

    def __init__(self, url: str, *, s3_endpoint: str | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.endpoint: str | None = None  # the resolved S3 endpoint (None: AWS, or a local store)
        self.retry = retry or RetryPolicy()
        """Retries of S3 reads (:mod:`.s3reads`); the loader's ``ReadOptions.retry`` overrides it."""
        self._reader: S3Reader | None = None
        self._fs_opts: dict[str, Any] = {}
        if url.startswith("s3://"):
            opts: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
            endpoint = (
                s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            )
            if endpoint:
                opts["client_kwargs"] = {"endpoint_url": endpoint}
                self.endpoint = endpoint
            import fsspec  # only S3 stores need it (it costs a local command most of its start-up)

            self._fs_opts = opts
            self.fs: Any = fsspec.filesystem("s3", **opts)
            self.root = url[len("s3://") :].rstrip("/")
            self.is_local = False
        elif "://" in url and not url.startswith("file://"):
            raise UsageError(f"store URL {url!r}: expected a local directory or s3://bucket/prefix")
        else:
            path = Path(url.removeprefix("file://")).expanduser().resolve()
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"store {url}: not a folder that can be created ({exc.strerror})") from exc
            self.fs = LocalFiles()
            self.root = str(path)
            self.is_local = True

    # ---- paths -------------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """Backend path of ``key``."""
        return f"{self.root}/{key}"

    @property
    def reader(self) -> S3Reader:
        """Bounded, retried GETs of this S3 store's objects (its own client: botocore retries off)."""
        if self.is_local:
            raise StoreError(f"{self.url}: a local store has no S3 reader")
        if self._reader is None:
            import fsspec

            from shardport.registry.store.s3reads import READER_CONFIG, S3Reader

            fs = fsspec.filesystem("s3", **self._fs_opts, config_kwargs=READER_CONFIG)
            self._reader = S3Reader(fs, self.retry)
        return self._reader

    def open_local(self, key: str, *, flags: int = 0) -> int:
        """A descriptor of local store file ``key``: no link followed, a regular file (see storefiles)."""
        with _io(key):
            return open_store_file(self.root, key, flags=flags)

    def read_ranges(
        self, requests: list[tuple[str, int, int]], *, concurrency: int, retry: RetryPolicy | None = None
    ) -> tuple[list[bytes | BaseException], int]:
        """S3: ``(key, start, end)`` byte ranges (:meth:`.s3reads.S3Reader.get_ranges`), and the retries."""
        paths = [(self.path(k), a, b) for k, a, b in requests]
        return self.reader.get_ranges(paths, concurrency=concurrency, policy=retry)

    # ---- generic reads -------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        with _io(key):
            return bool(self.fs.exists(self.path(key)))

    def read(self, key: str, *, max_size: int | None = None) -> bytes:
        """Whole content of a small object, refused when over ``max_size`` bytes.

        ``max_size`` defaults to :data:`BLOB_READ_MAX` for blobs, :data:`DOCUMENT_MAX` for the rest.
        """
        limit = max_size
        if limit is None:
            limit = BLOB_READ_MAX if key.startswith("blobs/") else DOCUMENT_MAX
        with _io(key):
            if self.is_local:
                return read_bounded(self.root, key, limit)
            return self.reader.get(self.path(key), limit)

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time of ``key``."""
        with _io(key):
            return self._info(key, self.fs.info(self.path(key)))

    def _info(self, key: str, raw: dict[str, Any]) -> ObjectInfo:
        mtime = raw.get("LastModified") or raw.get("mtime") or raw.get("created") or 0
        if not isinstance(mtime, datetime):
            mtime = datetime.fromtimestamp(float(mtime), tz=timezone.utc)
        return ObjectInfo(key=key, size=int(raw.get("size") or 0), mtime=mtime)

    def listdir(self, key: str) -> list[str]:
        """Names of the immediate children of folder ``key`` (empty when it does not exist)."""
        with _io(key):
            try:
                entries = self.fs.ls(self.path(key), detail=False)
            except FileNotFoundError:
                return []
        own = self.path(key).rstrip("/")
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != own})

    def walk(self, prefix: str) -> list[ObjectInfo]:
        """Every object under folder ``prefix``, recursively."""
        with _io(prefix):
            try:
                found = self.fs.find(self.path(prefix), detail=True)
            except FileNotFoundError:
                return []
        base = len(self.root) + 1
        out = []
        for path, raw in found.items():
            if raw.get("type") == "directory":
                continue
            out.append(self._info(path[base:], raw))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        """Remove ``key`` (missing is fine)."""
        with _io(key), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path(key))

    def delete_tree(self, key: str) -> None:
        """Remove folder ``key`` recursively (missing is fine)."""
        with _io(key), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(key), recursive=True)

    # ---- writes --------------------------------------------------------------------------------
    def _local_temp(self) -> Path:
        tmp = Path(self.root, "uploads", "tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp / uuid.uuid4().hex

    def put(self, key: str, data: bytes) -> None:
        """Write a small object, replacing any previous one atomically."""
        with _io(key):
            if self.is_local:
                tmp = self._local_temp()
                tmp.write_bytes(data)
                target = Path(self.path(key))
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, target)
            else:
                self.fs.pipe_file(self.path(key), data)

    def create_only(self, key: str, data: bytes) -> None:
        """Write ``key`` only if it does not exist yet; raise :class:`AlreadyExists` otherwise.

        Of many concurrent writers exactly one succeeds, and readers never see a partial object.
        """
        with _io(key):
            if self.is_local:
                tmp = self._local_temp()
                tmp.write_bytes(data)
                target = Path(self.path(key))
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(tmp, target)
                except FileExistsError as exc:
                    raise AlreadyExists(key) from exc
                finally:
                    tmp.unlink()
                return
            try:
                self.fs.pipe_file(self.path(key), data, mode="create")
            except FileExistsError as exc:
                raise AlreadyExists(key) from exc
            except Exception as exc:
                if _is_precondition_failure(exc):
                    raise AlreadyExists(key) from exc
                raise

    # ---- blobs ---------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """Whether the blob named ``digest`` is present (locally: as a regular file, not a link).

        So a push (or :meth:`put_blob`) replaces a link, a pipe or a device planted in a blob's place.
        """
        if not self.is_local:
            return self.exists(blob_key(digest))
        try:
            return stat.S_ISREG(os.lstat(self.path(blob_key(digest))).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise StoreError(f"{blob_key(digest)}: cannot stat: {exc}") from exc

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

        ``identity`` is the source's :func:`file_identity` taken before it was hashed; with it, a local
        upload is a kernel-side copy checked against that identity, without it the copy is re-hashed.
        ``move`` (with ``identity``; for files the caller wrote and no longer needs, e.g. a conversion's
        output in a leased upload folder of the store): a local store renames ``source`` into place when
        it is on the store's file system and unchanged since it was hashed, instead of copying it.
        Returns the number of bytes moved. Nothing is published when verification fails.
        """
        key = blob_key(digest)
        with _io(f"{source} -> {key}"):
            if self.is_local:
                if move and identity is not None and self._move_local(source, key, progress, identity):
                    return identity[1]
                return self._upload_local(source, digest, key, progress, identity)
            return self._upload_remote(source, digest, key, progress)

    def _move_local(
        self, source: Path, key: str, progress: Progress | None, identity: tuple[int, int, int, int]
    ) -> bool:
        """Rename ``source`` to ``key`` if it is unchanged since hashed; False when it cannot be renamed."""
        if file_identity(source) != identity:
            raise DigestMismatchError(
                f"{source}: changed after it was hashed (its size or modification time moved); re-run"
            )
        target = Path(self.path(key))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(source, target)
        except OSError as exc:
            if exc.errno == errno.EXDEV:  # another file system: copy instead
                return False
            raise
        if progress:
            progress(identity[1])
        return True

    def _copy_hashing(
        self, src: IO[bytes], dst: IO[bytes], progress: Progress | None, limit: int | None = None
    ) -> tuple[str, int]:
        h = hashlib.sha256()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        total = 0
        while n := src.readinto(buf):  # type: ignore[attr-defined]
            if limit is not None and total + n > limit:
                n = limit + 1 - total  # one byte past the limit proves the blob is too large
            h.update(view[:n])
            dst.write(view[:n])
            total += n
            if progress:
                progress(n)
            if limit is not None and total > limit:
                break
        return "sha256:" + h.hexdigest(), total

    def _upload_local(
        self,
        source: Path,
        digest: str,
        key: str,
        progress: Progress | None,
        identity: tuple[int, int, int, int] | None,
    ) -> int:
        """Kernel-side copy to a temporary name, verification, then rename into place.

        With ``identity`` (taken before push hashed the file), the copy is accepted only if the source's
        inode, size, mtime and ctime are unchanged at the end of the copy: every write to the source
        moves its mtime/ctime, so the published bytes are the hashed bytes, and re-hashing the copy from
        the page cache would prove nothing more. Without it, the copy is hashed.
        """
        tmp = self._local_temp()
        try:
            size = _kernel_copy(source, tmp, progress)
            _failpoints.hit("blob-written")
            if identity is not None:
                ok = file_identity(source) == identity and size == identity[1]
                found = "its size or modification time moved after it was hashed"
            else:
                got, _ = _digest_path(tmp)
                ok, found = got == digest, f"the copied bytes hash to {got}"
            if not ok:
                raise DigestMismatchError(
                    f"{source}: changed while pushing ({found}; expected {digest}); re-run"
                )
            target = Path(self.path(key))
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            return size
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _upload_remote(self, source: Path, digest: str, key: str, progress: Progress | None) -> int:
        with open(source, "rb", buffering=0) as src:
            dst = self.fs.open(self.path(key), "wb", block_size=max(CHUNK, 16 * 1024 * 1024))
            try:
                got, size = self._copy_hashing(src, dst, progress)
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

    def fetch_blob(
        self, digest: str, dest: Path, progress: Progress | None = None, *, max_size: int | None = None
    ) -> tuple[str, int]:
        """Copy blob ``digest`` to the new file ``dest``; return the digest and size of what was written.

        The store is untrusted: the caller compares the result with what it expected. At most
        ``max_size + 1`` bytes are read and written, so an oversized blob (or a local one replaced by a
        link to ``/dev/zero``: refused, see :mod:`.storefiles`) cannot fill the disk.
        """
        key = blob_key(digest)
        with _io(key):
            if self.is_local:
                src = open_store_file(self.root, key)
                try:
                    size = os.fstat(src).st_size
                    if max_size is not None and size > max_size:
                        return f"(a blob of {size} bytes)", size
                    _kernel_copy_fd(src, dest, progress, exclusive=True, limit=max_size)
                finally:
                    os.close(src)
                with open(dest, "rb", buffering=0) as copied:
                    return digest_stream(copied, limit=max_size)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out, self.open_blob(digest, max_size=max_size) as stream:
                return self._copy_hashing(stream, out, progress, limit=max_size)

    def digest_blob(self, digest: str, *, max_size: int | None = None) -> tuple[str, int]:
        """The stored blob's digest and size, reading at most ``max_size`` + 1 bytes of it."""
        with self.open_blob(digest, max_size=max_size) as stream, _io(blob_key(digest)):
            return digest_stream(stream, limit=max_size)

    def open_blob(self, digest: str, *, max_size: int | None = None) -> IO[bytes]:
        """A binary stream of the blob (verify what you read: the store is untrusted).

        With ``max_size`` the stream ends after ``max_size + 1`` bytes: a reader that got that many
        knows the blob is too large without reading the rest. Locally the blob must be a regular file
        (no link followed; :class:`~.errors.StoreObjectError` otherwise); on S3 each read is a ranged,
        retried GET.
        """
        key = blob_key(digest)
        limit = None if max_size is None else max_size + 1
        with _io(key):
            if self.is_local:
                return open_bounded(self.root, key, limit)  # type: ignore[return-value]
            return self.reader.open(self.path(key), limit)  # type: ignore[return-value]
