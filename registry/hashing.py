"""sha256 digests of bytes and files, streamed in large chunks (hashlib releases the GIL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

CHUNK = 8 * 1024 * 1024


def digest_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>``."""
    return digest.partition(":")[2]


def digest_stream(
    fh: IO[bytes], progress: Callable[[int], None] | None = None, *, limit: int | None = None
) -> tuple[str, int]:
    """Digest and size of what ``fh`` yields, at most ``limit`` + 1 bytes (None: to its end).

    With ``limit``, a size of ``limit + 1`` means "more than ``limit``": the rest is not read.
    """
    h = hashlib.sha256()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        want = CHUNK if limit is None else min(CHUNK, limit + 1 - size)
        if want <= 0:
            break
        n = fh.readinto(view[:want])  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
        size += n
        if progress:
            progress(n)
    return "sha256:" + h.hexdigest(), size


def digest_file(
    path: Path, progress: Callable[[int], None] | None = None, *, limit: int | None = None
) -> tuple[str, int]:
    """Stream ``path`` once; return its ``sha256:<hex>`` digest and size (see :func:`digest_stream`)."""
    with open(path, "rb", buffering=0) as fh:
        return digest_stream(fh, progress, limit=limit)
