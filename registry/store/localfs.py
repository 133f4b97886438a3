"""The few filesystem calls a local :class:`~.backend.Store` makes, on the standard library.

A local store used to go through fsspec's ``LocalFileSystem``; importing fsspec (with asyncio and its
caching layers) cost more than the rest of ``registry log`` together. :class:`LocalFiles` answers the
same calls with the same results for the methods the store uses (``exists``, ``cat_file``, ``info``,
``ls``, ``find``, ``rm_file``, ``rm``, ``pipe_file``, ``open``), so the store keeps one code path
and fsspec is imported only for S3. Paths are plain absolute paths, as the store builds them.

As in fsspec, ``info`` and ``find`` do not descend into symbolic links to folders; a link is reported
as a non-folder entry with its target's size (0 when the target is missing).
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import IO, Any


def _kind(mode: int) -> str:
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def _entry(path: str, st: os.stat_result) -> dict[str, Any]:
    """A folder entry as fsspec lists it: a link is ``other``, with its target's size (0 if none)."""
    link = stat.S_ISLNK(st.st_mode)
    size = st.st_size
    if link:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0
    return {"name": path, "size": size, "type": _kind(st.st_mode), "mtime": st.st_mtime, "islink": link}


class LocalFiles:
    """fsspec-compatible answers for the local store's calls (see the module docstring)."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (following links, as ``os.path.exists``)."""
        return os.path.exists(path)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the file (all of it by default)."""
        with open(path, "rb") as fh:
            if start:
                fh.seek(start)
            return fh.read() if end is None else fh.read(max(0, end - (start or 0)))

    def info(self, path: str) -> dict[str, Any]:
        """``name``, ``size``, ``type`` (file, directory, other), ``mtime``, ``islink`` of ``path``."""
        st = os.lstat(path)
        link = stat.S_ISLNK(st.st_mode)
        if link:  # a path (unlike a folder entry) is described by what it points to
            st = os.stat(path)
        return {
            "name": path,
            "size": st.st_size,
            "type": _kind(st.st_mode),
            "mtime": st.st_mtime,
            "islink": link,
        }

    def ls(self, path: str, detail: bool = False) -> list[Any]:
        """The entries of folder ``path`` (full paths, or infos with ``detail``); a file lists itself."""
        own = self.info(path)
        if own["type"] != "directory":
            return [own if detail else own["name"]]
        out: list[Any] = []
        with os.scandir(path) as entries:
            for e in entries:
                full = f"{path.rstrip('/')}/{e.name}"
                if not detail:
                    out.append(full)
                    continue
                try:
                    out.append(_entry(full, e.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
        return out

    def find(self, path: str, detail: bool = False) -> Any:
        """Every non-folder entry below ``path`` by full path (sorted); ``{}``/``[]`` when it is absent."""
        found: dict[str, dict[str, Any]] = {}
        stack = [path.rstrip("/") or "/"]
        while stack:
            folder = stack.pop()
            try:
                listing = self.ls(folder, detail=True)
            except OSError:
                continue
            for info in listing:
                if info["type"] == "directory" and info["name"] != folder:
                    stack.append(info["name"])
                elif info["type"] != "directory":
                    found[info["name"]] = info
        ordered = dict(sorted(found.items()))
        return ordered if detail else list(ordered)

    def rm_file(self, path: str) -> None:
        """Remove one file."""
        os.remove(path)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a folder and everything in it (``recursive``)."""
        if recursive and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite") -> None:
        """Write ``value`` to ``path`` (``mode="create"``: only if it does not exist)."""
        with open(path, "wb" if mode == "overwrite" else "xb") as fh:
            fh.write(value)

    def open(self, path: str, mode: str = "rb", **_: Any) -> IO[Any]:
        """The file opened in ``mode`` (fsspec's tuning keywords are accepted and ignored)."""
        return open(path, mode)
