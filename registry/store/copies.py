"""Byte copies the backends make: kernel-side file copies (local) and hashing stream copies (S3)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from shardport.registry.artifact.hashing import CHUNK, digest_stream

Progress = Callable[[int], None]
"""Called with the bytes moved since the last call."""


def file_identity(path: Path) -> tuple[int, int, int, int]:
    """(inode, size, mtime_ns, ctime_ns): changes whenever the file's content is written."""
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def kernel_copy(src: Path, dst: Path, progress: Progress | None, *, exclusive: bool = False) -> int:
    """Copy ``src`` to a new file ``dst`` inside the kernel (copy_file_range); return bytes copied."""
    with open(src, "rb", buffering=0) as fin:
        return kernel_copy_fd(fin.fileno(), dst, progress, exclusive=exclusive)


def kernel_copy_fd(
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


def copy_hashing(
    src: IO[bytes], dst: IO[bytes], progress: Progress | None, limit: int | None = None
) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` (at most ``limit`` + 1 bytes), hashing; return the digest and bytes copied."""
    return digest_stream(src, progress, limit=limit, sink=dst.write)
