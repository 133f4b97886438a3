"""Byte sources the gates parse from: a small range-read protocol, a local file and an in-memory buffer.

The gates never see a file object. They call ``read(offset, length)`` on a :class:`ByteSource`, which
lets the same parser run over a local file, a buffer in a test, or a range-read remote object (an
fsspec or S3 adapter only has to provide ``name``, ``size`` and ``read``). :func:`read_exact` is the
single place where read failures become :class:`ContainerReadError` or :class:`TruncatedFileError`.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Protocol, runtime_checkable

from .errors import ContainerReadError, TruncatedFileError


@runtime_checkable
class ByteSource(Protocol):
    """A read-only, random-access byte range source of known size.

    ``read`` may return fewer bytes than asked only at the end of the object; the gates treat a short
    read as truncation. ``name`` is what error messages call the file.
    """

    @property
    def name(self) -> str:
        """The name error messages use for this source (a path or URL)."""
        ...

    @property
    def size(self) -> int:
        """The total size of the object in bytes."""
        ...

    def read(self, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes starting at ``offset``."""
        ...


class BytesSource:
    """A :class:`ByteSource` over bytes already in memory (tests, small downloaded headers)."""

    __slots__ = ("_data", "_name")

    def __init__(self, data: bytes, name: str = "<memory>") -> None:
        self._data = bytes(data)
        self._name = name

    @property
    def name(self) -> str:
        """The name error messages use."""
        return self._name

    @property
    def size(self) -> int:
        """The length of the buffer."""
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes from ``offset``."""
        return self._data[offset : offset + length]


class FileSource:
    """A :class:`ByteSource` over a local file, read with ``os.pread`` (no shared file position).

    Use it as a context manager; the size is taken once, when the file is opened.
    """

    __slots__ = ("_fd", "_name", "_size")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._name = os.fspath(path)
        try:
            self._fd = os.open(self._name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise ContainerReadError(
                self._name,
                field="open",
                expected="a readable file",
                found=f"{type(exc).__name__}: {exc}",
                remedy="check the path and its permissions",
            ) from exc
        try:
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            os.close(self._fd)
            raise ContainerReadError(
                self._name, field="stat", expected="a file size", found=f"{type(exc).__name__}: {exc}"
            ) from exc

    @property
    def name(self) -> str:
        """The path as given."""
        return self._name

    @property
    def size(self) -> int:
        """The file size at open time."""
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        """Return up to ``length`` bytes from ``offset`` (raises ``OSError`` on I/O failure)."""
        chunks: list[bytes] = []
        while length > 0:
            chunk = os.pread(self._fd, length, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            length -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close the file descriptor."""
        os.close(self._fd)

    def __enter__(self) -> FileSource:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def source_size(source: ByteSource) -> int:
    """Return ``source.size`` after checking that it is a non-negative integer."""
    size = source.size
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ContainerReadError(
            source.name, field="size", expected="a non-negative integer", found=repr(size)
        )
    return size


def read_exact(source: ByteSource, offset: int, length: int, *, what: str) -> bytes:
    """Read exactly ``length`` bytes at ``offset`` or raise a named error saying ``what`` was being read."""
    try:
        data = source.read(offset, length)
    except OSError as exc:
        raise ContainerReadError(
            source.name,
            field=what,
            expected=f"{length} readable bytes at offset {offset}",
            found=f"{type(exc).__name__}: {exc}",
            remedy="retry; if it persists, the file or the store is damaged",
        ) from exc
    if len(data) != length:
        raise TruncatedFileError(
            source.name,
            field=what,
            expected=f"{length} bytes at offset {offset}",
            found=f"{len(data)} bytes (the file ends early)",
            remedy="re-download or re-export the file",
        )
    return bytes(data)
