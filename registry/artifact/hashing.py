"""sha256 digests of bytes and files, streamed in large chunks (hashlib releases the GIL)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeGuard

from shardport.registry.errors import MalformedDigestError

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest

CHUNK = 8 * 1024 * 1024
DIGEST_FORM = "'sha256:' followed by 64 lowercase hex digits"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def digest_bytes(data: bytes) -> Digest:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a digest in the one accepted form: ``sha256:`` + 64 lowercase hex digits."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def digest_of_hex(name: str) -> Digest | None:
    """``sha256:<name>`` if that is a digest (a store key's last part: blob, referrer), else None."""
    digest = "sha256:" + name
    return digest if is_digest(digest) else None


def check_digest(value: object, *, what: str = "digest") -> Digest:
    """Return ``value`` if it is a well-formed digest, else raise :class:`MalformedDigestError`.

    Every digest read from the store (manifests, tag documents, referrers, leases, client state) goes
    through here or :data:`shardport.registry.artifact.digests.Digest` before it names a key or a file.
    """
    if not is_digest(value):
        raise MalformedDigestError(f"{what}: {value!r} is not a digest; expected {DIGEST_FORM}")
    return value


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>``; :class:`MalformedDigestError` for anything else.

    Every store key built from a digest (blobs, referrers) goes through here, so a digest such as
    ``sha256:../../etc/passwd`` can never name a key outside ``blobs/sha256/``.
    """
    return check_digest(digest)[len("sha256:") :]


def digest_stream(
    fh: IO[bytes],
    progress: Callable[[int], None] | None = None,
    *,
    limit: int | None = None,
    length: int | None = None,
    sink: Callable[[memoryview], object] | None = None,
) -> tuple[Digest, int]:
    """Digest and size of what ``fh`` yields: the one streaming hasher.

    ``limit``: read at most ``limit`` + 1 bytes (a size of ``limit + 1`` means "more than ``limit``": the
    rest is not read); ``length``: read at most ``length`` bytes; neither: to the end. ``sink`` gets every
    chunk hashed (a copy that hashes as it writes); ``progress`` the count of each.
    """
    cap = length if length is not None else (limit + 1 if limit is not None else None)
    h = hashlib.sha256()
    size = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        want = CHUNK if cap is None else min(CHUNK, cap - size)
        if want <= 0:
            break
        n = fh.readinto(view[:want])  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
        if sink is not None:
            sink(view[:n])
        size += n
        if progress:
            progress(n)
    return "sha256:" + h.hexdigest(), size


def digest_range(path: Path, start: int, end: int) -> tuple[Digest, int]:
    """Digest and length of bytes ``[start, end)`` of ``path`` (fewer bytes when the file is shorter)."""
    with open(path, "rb", buffering=0) as fh:
        fh.seek(start)
        return digest_stream(fh, length=end - start)


def digest_file(
    path: Path, progress: Callable[[int], None] | None = None, *, limit: int | None = None
) -> tuple[Digest, int]:
    """Stream ``path`` once; return its ``sha256:<hex>`` digest and size (see :func:`digest_stream`)."""
    with open(path, "rb", buffering=0) as fh:
        return digest_stream(fh, progress, limit=limit)
