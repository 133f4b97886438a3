"""The local backend: a store in a folder of this machine's file system.

Create-only writes are an ``os.link`` of a finished temporary file; blobs are published by a kernel-side
copy (or a rename) to a temporary name, verified, then renamed into place. Every read opens the store's
file without following links and requires a regular file (:mod:`.localfiles`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from shardport.registry import _failpoints
from shardport.registry.artifact.hashing import digest_file, digest_stream
from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, UsageError
from shardport.registry.store.copies import Progress, file_identity, kernel_copy, kernel_copy_fd
from shardport.registry.store.fsstore import FsStore
from shardport.registry.store.keys import blob_key, read_limit
from shardport.registry.store.localfiles import open_bounded, open_store_file, read_bounded
from shardport.registry.store.localfs import LocalFiles
from shardport.registry.store.protocol import AlreadyExists, RangeResult, ReadProfile, storage_errors
from shardport.registry.store.retry import RetryPolicy

LOCAL_MAX_GAP = 4096
"""Default gap bridged locally: within a page the device reads the bytes anyway."""
LOCAL_MIN_DEPTH = 4
"""Local batches in flight at least, whatever the CPU count: a cold read needs several requests in flight
to keep the disk busy (2 vCPU, rank 0 of 4 of 2 GiB, alone: at depth 2 cold ranks read at 0.55-0.65x the
disk's sequential rate, at depth 4 0.6-0.9x, at 8 no better; warm loads the same within noise)."""


def _pread(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``fd`` (fewer only where the file ends)."""
    parts: list[bytes] = []
    at = start
    while at < end:
        chunk = os.pread(fd, end - at, at)
        if not chunk:
            break
        parts.append(chunk)
        at += len(chunk)
    return b"".join(parts)


class LocalStore(FsStore):
    """A store rooted at a local folder (created when missing)."""

    def __init__(self, url: str, *, s3_endpoint: str | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.endpoint = None
        self.retry = retry or RetryPolicy()
        path = Path(url.removeprefix("file://")).expanduser().resolve()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"store {url}: not a folder that can be created ({exc.strerror})") from exc
        self.fs = LocalFiles()
        self.root = str(path)

    @property
    def profile(self) -> ReadProfile:
        """Small gaps (a page), CPU count batches in flight (4..8), ``O_DIRECT``, descriptors."""
        depth = min(8, max(LOCAL_MIN_DEPTH, os.cpu_count() or 1))
        return ReadProfile(max_gap=LOCAL_MAX_GAP, depth=depth, direct_io=True, file_handles=True)

    @property
    def local_root(self) -> Path:
        """The store's folder."""
        return Path(self.root)

    # ---- reads -----------------------------------------------------------------------------------
    def open_local(self, key: str, *, flags: int = 0) -> int:
        """A descriptor of store file ``key``: no link followed, a regular file (see :mod:`.localfiles`)."""
        with storage_errors(key):
            return open_store_file(self.root, key, flags=flags)

    def read(self, key: str, *, max_size: int | None = None) -> bytes:
        """Whole content of a small object, refused (before reading it) when over the limit."""
        with storage_errors(key):
            return read_bounded(self.root, key, read_limit(key, max_size))

    def read_ranges(
        self,
        requests: list[tuple[str, int, int]],
        *,
        concurrency: int,
        retry: RetryPolicy | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> tuple[list[RangeResult], int]:
        """``(key, start, end)`` ranges by ``pread`` of each key's checked descriptor, in order.

        No retries (``concurrency`` and ``retry`` are for remote stores). ``sizes``: see the protocol.
        """
        fds: dict[str, int | BaseException] = {}
        out: list[RangeResult] = []
        try:
            for key, start, end in requests:
                if key not in fds:
                    try:
                        fds[key] = open_store_file(self.root, key)
                    except NotFoundError as exc:
                        missing = FileNotFoundError(str(exc))
                        missing.__cause__ = exc
                        fds[key] = missing
                    except Exception as exc:
                        fds[key] = exc
                    fds[key] = _sized(fds[key], key, (sizes or {}).get(key))
                fd = fds[key]
                if isinstance(fd, BaseException):
                    out.append(fd)
                    continue
                try:
                    out.append(_pread(fd, start, end))
                except OSError as exc:
                    out.append(exc)
        finally:
            for fd in fds.values():
                if isinstance(fd, int):
                    os.close(fd)
        return out, 0

    def open_blob(self, digest: str, *, max_size: int | None = None) -> IO[bytes]:
        """A bounded stream of the blob's file (a regular file, no link followed)."""
        key = blob_key(digest)
        with storage_errors(key):
            return open_bounded(self.root, key, None if max_size is None else max_size + 1)  # type: ignore[return-value]

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is present as a regular file (a link, pipe or device is not a blob)."""
        try:
            return stat.S_ISREG(os.lstat(self.path(blob_key(digest))).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise StoreError(f"{blob_key(digest)}: cannot stat: {exc}") from exc

    def fetch_blob(
        self, digest: str, dest: Path, progress: Progress | None = None, *, max_size: int | None = None
    ) -> tuple[str, int]:
        """Kernel-side copy of the blob's (checked) file to the new file ``dest``, then hash the copy."""
        key = blob_key(digest)
        with storage_errors(key):
            src = open_store_file(self.root, key)
            try:
                size = os.fstat(src).st_size
                if max_size is not None and size > max_size:
                    return f"(a blob of {size} bytes)", size
                kernel_copy_fd(src, dest, progress, exclusive=True, limit=max_size)
            finally:
                os.close(src)
            with open(dest, "rb", buffering=0) as copied:
                return digest_stream(copied, limit=max_size)

    # ---- writes ----------------------------------------------------------------------------------
    def _temp(self) -> Path:
        tmp = Path(self.root, "uploads", "tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp / uuid.uuid4().hex

    def _target(self, key: str) -> Path:
        target = Path(self.path(key))
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def put(self, key: str, data: bytes) -> None:
        """Write a temporary file, then rename it over ``key``."""
        with storage_errors(key):
            tmp = self._temp()
            tmp.write_bytes(data)
            os.replace(tmp, self._target(key))

    def create_only(self, key: str, data: bytes) -> None:
        """Write a temporary file, then hard-link it to ``key`` (which fails when ``key`` exists)."""
        with storage_errors(key):
            tmp = self._temp()
            tmp.write_bytes(data)
            target = self._target(key)
            try:
                os.link(tmp, target)
            except FileExistsError as exc:
                raise AlreadyExists(key) from exc
            finally:
                tmp.unlink()

    def upload_blob(
        self,
        source: Path,
        digest: str,
        progress: Progress | None = None,
        *,
        identity: tuple[int, int, int, int] | None = None,
        move: bool = False,
    ) -> int:
        """Rename (``move``) or copy ``source`` into place, verified (:meth:`Store.upload_blob`)."""
        key = blob_key(digest)
        with storage_errors(f"{source} -> {key}"):
            if move and identity is not None and self._move(source, key, progress, identity):
                return identity[1]
            return self._copy_in(source, digest, key, progress, identity)

    def _move(
        self, source: Path, key: str, progress: Progress | None, identity: tuple[int, int, int, int]
    ) -> bool:
        """Rename ``source`` to ``key`` if it is unchanged since hashed; False when it cannot be renamed."""
        if file_identity(source) != identity:
            raise DigestMismatchError(
                f"{source}: changed after it was hashed (its size or modification time moved); re-run"
            )
        try:
            os.replace(source, self._target(key))
        except OSError as exc:
            if exc.errno == errno.EXDEV:  # another file system: copy instead
                return False
            raise
        if progress:
            progress(identity[1])
        return True

    def _copy_in(
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
        tmp = self._temp()
        try:
            size = kernel_copy(source, tmp, progress)
            _failpoints.hit("blob-written")
            if identity is not None:
                ok = file_identity(source) == identity and size == identity[1]
                found = "its size or modification time moved after it was hashed"
            else:
                got, _ = digest_file(tmp)
                ok, found = got == digest, f"the copied bytes hash to {got}"
            if not ok:
                raise DigestMismatchError(
                    f"{source}: changed while pushing ({found}; expected {digest}); re-run"
                )
            os.replace(tmp, self._target(key))
            return size
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def _sized(fd: int | BaseException, key: str, expected: int | None) -> int | BaseException:
    """``fd`` when its file has the ``expected`` size (or none is expected), else the mismatch (fd closed)."""
    if isinstance(fd, BaseException) or expected is None:
        return fd
    found = os.fstat(fd).st_size
    if found == expected:
        return fd
    os.close(fd)
    return DigestMismatchError(
        f"{key}: the object is {found} bytes, the manifest says {expected} (bytes appended or cut; run fsck)"
    )
