"""What both backends answer the same way, through an fsspec-style file system (listings, deletes).

A local store's file system is :class:`~.localfs.LocalFiles` (the standard library answering fsspec's
calls, so a local command does not import fsspec); an S3 store's is s3fs.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from typing import Any

from shardport.registry.store.protocol import ObjectInfo, Store, storage_errors


def object_info(key: str, raw: dict[str, Any]) -> ObjectInfo:
    """An fsspec ``info``/``find`` entry as an :class:`ObjectInfo`."""
    mtime = raw.get("LastModified") or raw.get("mtime") or raw.get("created") or 0
    if not isinstance(mtime, datetime):
        mtime = datetime.fromtimestamp(float(mtime), tz=timezone.utc)
    return ObjectInfo(key=key, size=int(raw.get("size") or 0), mtime=mtime)


class FsStore(Store):
    """A :class:`Store` whose listings and deletes go through ``fs`` at paths ``root/key``."""

    fs: Any
    """The backend's fsspec-style file system (the backend's own: not part of the protocol)."""

    def path(self, key: str) -> str:
        """Backend path of ``key`` (a local store: the file's path)."""
        return f"{self.root}/{key}"

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        with storage_errors(key):
            return bool(self.fs.exists(self.path(key)))

    def info(self, key: str) -> ObjectInfo:
        """Size and modification time of ``key``."""
        with storage_errors(key):
            return object_info(key, self.fs.info(self.path(key)))

    def listdir(self, key: str) -> list[str]:
        """Names of the immediate children of folder ``key`` (empty when it does not exist)."""
        with storage_errors(key):
            try:
                entries = self.fs.ls(self.path(key), detail=False)
            except FileNotFoundError:
                return []
        own = self.path(key).rstrip("/")
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != own})

    def walk(self, prefix: str) -> list[ObjectInfo]:
        """Every object under folder ``prefix``, recursively."""
        with storage_errors(prefix):
            try:
                found = self.fs.find(self.path(prefix), detail=True)
            except FileNotFoundError:
                return []
        base = len(self.root) + 1
        out = []
        for path, raw in found.items():
            if raw.get("type") == "directory":
                continue
            out.append(object_info(path[base:], raw))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        """Remove ``key`` (missing is fine)."""
        with storage_errors(key), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path(key))

    def delete_tree(self, key: str) -> None:
        """Remove folder ``key`` recursively (missing is fine)."""
        with storage_errors(key), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(key), recursive=True)
