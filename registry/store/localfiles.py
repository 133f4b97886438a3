"""Opening a local store's own files without trusting them: no links, regular files only, bounded reads.

Anyone with write access to a shared store folder can put a symbolic link (to ``/dev/zero``, to a huge
sparse file, to a file outside the store), a named pipe, a device or a folder where a blob, manifest,
tag document or referrer belongs. Every local read of a store file goes through :func:`open_store_file`:

- the key's folders are opened one by one from the store root with ``O_NOFOLLOW | O_DIRECTORY`` (a link
  anywhere below the root is refused; the root itself was resolved when the store was opened);
- the file is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a named pipe cannot block the open) and
  ``fstat``-ed: anything but a regular file is a :class:`~.errors.StoreObjectError` naming the key and
  what was found;
- readers never take more than the expected size + 1 byte (:func:`read_bounded`,
  :class:`BoundedReader`), so "too large" is seen without reading the rest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import stat

from shardport.registry.errors import NotFoundError, StoreError, StoreObjectError

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFSOCK: "a socket",
}
_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a regular file``, ``a symbolic link``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return _KINDS.get(stat.S_IFMT(mode), f"a file of type {stat.S_IFMT(mode):#o}")


def _found(dir_fd: int, name: str) -> str:
    try:
        return kind_of(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return "not a regular file"


def _refuse(key: str, what: str, found: str, expected: str = "a regular file") -> StoreObjectError:
    return StoreObjectError(
        f"{key}: {what} is {found}, not {expected} "
        "(the store was tampered with or damaged: remove what is there, then run fsck)"
    )


def open_store_file(root: str, key: str, *, flags: int = 0) -> int:
    """Open ``root/key`` read-only as a regular file without following any link below ``root``.

    ``flags`` are added to the file's open (e.g. ``O_DIRECT``). Raises :class:`~.errors.NotFoundError`
    when it does not exist and :class:`~.errors.StoreObjectError` when it, or a folder on its way, is
    not what it must be. The caller owns (closes) the descriptor.
    """
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreObjectError(f"{key}: not a store key (empty, '.' or '..' component)")
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for n, part in enumerate(parts[:-1]):
            try:
                sub = os.open(part, _READ | os.O_DIRECTORY, dir_fd=dir_fd)
            except FileNotFoundError as exc:
                raise NotFoundError(f"{key}: not found in the store") from exc
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = f"folder '{'/'.join(parts[: n + 1])}'"
                    raise _refuse(key, where, _found(dir_fd, part), "a real folder") from exc
                raise StoreError(f"{key}: cannot open: {exc}") from exc
            os.close(dir_fd)
            dir_fd = sub
        try:
            fd = os.open(parts[-1], _READ | os.O_NONBLOCK | flags, dir_fd=dir_fd)
        except FileNotFoundError as exc:
            raise NotFoundError(f"{key}: not found in the store") from exc
        except OSError as exc:  # ELOOP: a link; ENXIO: a socket; EISDIR with O_DIRECT and the like
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise _refuse(key, "the object", _found(dir_fd, parts[-1])) from exc
            raise StoreError(f"{key}: cannot open: {exc}") from exc
    finally:
        os.close(dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(key, "the object", kind_of(mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def too_large(key: str, size: int, limit: int, what: str = "its expected size") -> StoreObjectError:
    """The error for ``key`` holding more than ``limit`` bytes (``size``: at least this many)."""
    return StoreObjectError(f"{key}: holds {size} bytes or more, more than {what} ({limit} bytes)")


def read_bounded(root: str, key: str, limit: int) -> bytes:
    """The whole content of store file ``key``, refused (before reading it) when over ``limit`` bytes."""
    fd = open_store_file(root, key)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        size = os.fstat(fd).st_size
        if size > limit:
            raise too_large(key, size, limit, "the documented maximum for it")
        data = bytearray()
        step = max(size + 1, 1 << 16)  # read() allocates what it is asked for: the size, not the cap
        while len(data) <= limit and (chunk := fh.read(min(step, limit + 1 - len(data)))):
            data += chunk
    if len(data) > limit:  # it grew while read
        raise too_large(key, len(data), limit, "the documented maximum for it")
    return bytes(data)


class BoundedReader(io.RawIOBase):
    """A raw binary stream over ``raw`` that ends after ``limit`` bytes (None: where ``raw`` ends).

    Readers wanting to see "too large" pass the expected size + 1.
    """

    def __init__(self, raw: io.RawIOBase, limit: int | None) -> None:
        super().__init__()
        self._raw = raw
        self._left = limit

    def readable(self) -> bool:
        """Always: a read-only stream."""
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        """Read into ``buffer``, never past the limit."""
        view = memoryview(buffer).cast("B")
        if self._left is not None:
            if self._left <= 0:
                return 0
            view = view[: self._left]
        n = self._raw.readinto(view) or 0
        if self._left is not None:
            self._left -= n
        return n

    def close(self) -> None:
        """Close the underlying stream."""
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


def open_bounded(root: str, key: str, limit: int | None) -> BoundedReader:
    """:func:`open_store_file` as a stream of at most ``limit`` bytes."""
    return BoundedReader(io.FileIO(open_store_file(root, key), "rb", closefd=True), limit)
