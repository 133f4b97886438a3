"""sha256 digests of bytes and files, streamed in large chunks (hashlib releases the GIL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def digest_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>``."""
    return digest.partition(":")[2]


def digest_file(path: Path, progress: Callable[[int], None] | None = None) -> tuple[str, int]:
    """Stream ``path`` once; return its ``sha256:<hex>`` digest and size."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            size += n
            if progress:
                progress(n)
    return "sha256:" + h.hexdigest(), size
