"""Validation of file paths taken from manifests (untrusted) before anything is written."""

from __future__ import annotations

from pathlib import PurePosixPath

from shardport.registry.describe import METADATA_DIR
from shardport.registry.errors import UnsafePathError

MAX_PATH = 4096


def check_paths(paths: list[str], *, source: str) -> list[PurePosixPath]:
    """Return ``paths`` as relative POSIX paths, or raise :class:`UnsafePathError`.

    Refused: empty, absolute, ``..`` or ``.`` segments, backslashes, NUL or control characters,
    duplicates, a file that is also another file's folder, and the reserved metadata folder.
    """
    seen: set[str] = set()
    out: list[PurePosixPath] = []
    for raw in paths:
        where = f"{source}: file path {raw!r}"
        if not raw or len(raw) > MAX_PATH:
            raise UnsafePathError(f"{where}: empty or longer than {MAX_PATH} characters")
        if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
            raise UnsafePathError(f"{where}: absolute paths are refused")
        if "\\" in raw or any(ord(c) < 32 for c in raw):
            raise UnsafePathError(f"{where}: backslashes and control characters are refused")
        parts = raw.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise UnsafePathError(f"{where}: empty, '.' or '..' segments would escape the destination")
        if parts[0] == METADATA_DIR:
            raise UnsafePathError(f"{where}: {METADATA_DIR}/ is reserved for shardport metadata")
        if raw in seen:
            raise UnsafePathError(f"{where}: listed twice")
        seen.add(raw)
        out.append(PurePosixPath(raw))
    for p in out:
        for parent in p.parents:
            if str(parent) in seen:
                raise UnsafePathError(
                    f"{source}: {str(parent)!r} is both a file and the folder of {str(p)!r}"
                )
    return out
