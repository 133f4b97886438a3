"""The one way shardport writes files into a folder it does not own: staged, then renamed into place.

:class:`StagedFiles` writes each file under a temporary name inside the folder (see
:mod:`~shardport.registry.output.staging`), created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the
folder opened once, so no link already in the folder is ever followed. :meth:`StagedFiles.publish`
first checks every final name (absent, or a regular file that is then replaced; a symbolic link or
anything else is refused and nothing is published), then renames the files into place; a rename
replaces the directory entry, never what a link points to. If anything fails (or the block is left
by an exception or a signal), every temporary file is removed and names already published are put
back as they were, so the folder is left as it was.

A safetensors file is written from contiguous buffers, reopened and compared before it is published
(``safetensors.numpy.save_file`` silently scrambles non-contiguous arrays; it also renames its own
temporary file into place, so it is not used here).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy only where tensors are written: small files (state, trust) need none
    import numpy as np
    import numpy.typing as npt

from shardport.registry.errors import UsageError, VerificationError
from shardport.registry.output.staging import remove_stale, temp_name
from shardport.registry.store.libc import libc_function

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_NOT_SUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP)
_renameat2: Any = None


def renameat2(
    src: str | Path, dst: str | Path, flags: int, *, src_dir_fd: int = AT_FDCWD, dst_dir_fd: int = AT_FDCWD
) -> bool:
    """``rename(2)`` with ``flags`` (Linux ``renameat2``); False where the system or file system lacks it.

    Raises ``OSError`` when the rename itself fails (``EEXIST`` under ``RENAME_NOREPLACE``, ...).
    """
    global _renameat2
    if _renameat2 is None:
        _renameat2 = libc_function("renameat2", ctypes.c_int) or False
    if not _renameat2:
        return False
    rc = _renameat2(src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), flags)
    if rc != 0:
        err = ctypes.get_errno()
        if err in _NOT_SUPPORTED:
            return False
        raise OSError(err, os.strerror(err), str(src), None, str(dst))
    return True


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UsageError(f"{name!r}: not a file name")


# the safetensors library's dtype order (largest last): files list tensors by it, descending, then name
_SAFETENSORS_DTYPES_BY_RANK = (
    "bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32", "float64", "int64",
    "uint64",
)  # fmt: skip
_SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "uint64": "U64",
    "int32": "I32",
    "uint32": "U32",
    "int16": "I16",
    "uint16": "U16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_FILE_ORDER = {name: rank for rank, name in enumerate(_SAFETENSORS_DTYPES_BY_RANK)}
_COMPARE_BYTES = 8 << 20
TensorBytes = tuple[str, tuple[str, list[int]], "npt.NDArray[np.uint8]"]


def safetensors_layout(
    arrays: Mapping[str, npt.NDArray[Any]], metadata: Mapping[str, str] | None = None
) -> tuple[bytes, list[TensorBytes]]:
    """A safetensors file's header and its tensors' bytes in file order (name, (dtype, shape), bytes).

    The header is the 8-byte little-endian length and the JSON, padded with spaces to a multiple of 8
    bytes; tensors are ordered as the safetensors library orders them (by dtype, widest first, then
    name; each then starts aligned to its item size), so the file is byte for byte the one
    ``safetensors.numpy.save`` would make.
    """
    if "__metadata__" in arrays:
        raise UsageError("a tensor cannot be named __metadata__ in a safetensors file")
    doc: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    out: list[TensorBytes] = []
    at = 0
    order = sorted(arrays, key=lambda k: (-_FILE_ORDER.get(arrays[k].dtype.name, 0), k))
    for key in order:
        array = arrays[key]
        kind = _SAFETENSORS_DTYPES.get(array.dtype.name)
        if kind is None:
            raise UsageError(f"tensor {key}: dtype {array.dtype} cannot be written to a safetensors file")
        import numpy as np

        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        raw = little.reshape(-1).view(np.uint8)
        shape = [int(n) for n in array.shape]
        doc[key] = {"dtype": kind, "shape": shape, "data_offsets": [at, at + raw.nbytes]}
        at += raw.nbytes
        out.append((key, (kind, shape), raw))
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, out


def _first_difference(path: str, header: bytes, data: list[TensorBytes]) -> str | None:
    """What in the file at ``path`` differs from ``header`` and ``data`` (None: every byte equal).

    The file is read back a chunk at a time into one reused buffer (not mapped: mapped pages would
    count in the process's resident memory, doubling a rank pull's peak).
    """
    import numpy as np

    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if size != len(header) + sum(raw.nbytes for _, _, raw in data):
            return f"the file's size {size}"
        if os.pread(fd, len(header), 0) != header:
            return "the header"
        buf = np.empty(min(_COMPARE_BYTES, max((raw.nbytes for _, _, raw in data), default=0)), np.uint8)
        at = len(header)
        for key, _, raw in data:
            for lo in range(0, raw.nbytes, _COMPARE_BYTES):
                back = buf[: min(_COMPARE_BYTES, raw.nbytes - lo)]
                if not _read_exactly(fd, back, at + lo) or not np.array_equal(
                    back, raw[lo : lo + back.nbytes]
                ):
                    return f"tensor {key}"
            at += raw.nbytes
    return None


def _read_exactly(fd: int, into: npt.NDArray[np.uint8], offset: int) -> bool:
    """Fill ``into`` from ``fd`` at ``offset``; False if the file ends first."""
    view = into.data.cast("B")
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            return False
        view, offset = view[n:], offset + n
    return True


class StagedFiles:
    """Files staged under temporary names in ``folder`` and published together (see the module).

    Use as a context manager; leaving it without :meth:`publish` (or by an exception) discards
    everything staged (and removes ``folder`` again if it was made for them). Creating one creates
    ``folder`` if needed and removes stale temporary files of dead processes in it.
    """

    def __init__(self, folder: Path, *, durable: bool = False) -> None:
        """Open (or create) ``folder`` for staged files.

        ``durable``: each staged file is flushed to disk (``fsync``) before it is published, and the
        folder after the renames (an output file the user asked for; a pull's files are not).
        """
        self._durable = durable
        self._created = not os.path.lexists(folder)
        if durable and self._created:  # an output file's folder was checked to exist: never made here
            raise UsageError(f"{folder}: the folder is gone (it existed when the destination was checked)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileExistsError, NotADirectoryError) as exc:
            raise UsageError(f"{folder}: exists and is not a folder") from exc
        except OSError as exc:  # permissions, a read-only or full file system
            raise UsageError(f"{folder}: cannot write files there ({exc.strerror or exc})") from exc
        self.folder = folder
        self._published = False
        self._staged: dict[str, tuple[str, int, int]] = {}  # final name -> (temp name, dev, inode)
        remove_stale(folder, "part", dir_fd=self._fd)

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Discard whatever is still staged and close the folder."""
        if self._fd < 0:
            return
        try:
            self.discard()
        finally:
            os.close(self._fd)
            self._fd = -1
        if self._created and not self._published:  # a folder made for files never published
            with contextlib.suppress(OSError):
                self.folder.rmdir()

    def discard(self) -> None:
        """Remove every staged temporary file."""
        while self._staged:
            _, (temp, _, _) = self._staged.popitem()
            self._unlink(temp)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except FileNotFoundError:
            pass

    def write_bytes(self, name: str, data: bytes | memoryview) -> None:
        """Stage ``data`` as file ``name`` (replacing anything staged under that name before)."""
        self._write(name, [data])

    def _write(self, name: str, chunks: Iterable[bytes | memoryview]) -> None:
        _check_name(name)
        if name in self._staged:
            self._unlink(self._staged.pop(name)[0])
        temp = temp_name(name, "part")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._staged[name] = (temp, -1, -1)  # recorded first: discard() removes it, even after a signal
        try:
            fd = os.open(temp, flags, 0o644, dir_fd=self._fd)
        except FileExistsError:  # not ours (a fresh random name: practically never)
            del self._staged[name]
            raise
        except OSError as exc:  # no permission, a read-only or full file system
            del self._staged[name]
            raise UsageError(f"{self.folder / name}: cannot create it ({exc.strerror or exc})") from exc
        try:
            st = os.fstat(fd)
            self._staged[name] = (temp, st.st_dev, st.st_ino)
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
            if self._durable:
                os.fsync(fd)
        except OSError as exc:  # a full disk, a quota, an I/O error: the staged file goes in discard()
            raise UsageError(f"{self.folder / name}: could not write it ({exc.strerror or exc})") from exc
        finally:
            os.close(fd)

    def write_text(self, name: str, text: str) -> None:
        """Stage ``text`` (UTF-8) as file ``name``."""
        self.write_bytes(name, text.encode())

    def write_safetensors(
        self, name: str, arrays: Mapping[str, npt.NDArray[Any]], metadata: Mapping[str, str] | None = None
    ) -> None:
        """Stage ``arrays`` as safetensors file ``name``, kept only if every tensor reads back exactly.

        Each tensor's bytes go from a contiguous little-endian buffer straight to the file (no copy of
        the whole file in memory). The staged file is then reopened: the safetensors library must
        read back every name, dtype and shape and the metadata, and every byte is read back and
        compared, a chunk at a time (one 8 MiB buffer).
        """
        from safetensors import safe_open

        header, data = safetensors_layout(arrays, metadata)
        self._write(name, [header, *(raw.data for _, _, raw in data)])
        where = self.folder / name
        with self._reopen(name) as path:
            with safe_open(path, framework="numpy") as back:
                names, meta = set(back.keys()), back.metadata() or {}
                if names != {key for key, _, _ in data} or meta != dict(metadata or {}):
                    raise VerificationError(f"{where}: does not read back with the names and metadata it got")
                for key, (kind, shape), _ in data:
                    piece = back.get_slice(key)
                    if piece.get_dtype() != kind or list(piece.get_shape()) != shape:
                        raise VerificationError(f"{where}: tensor {key} does not read back as written")
            bad = _first_difference(path, header, data)
        if bad is not None:
            raise VerificationError(f"{where}: {bad} does not read back as written")

    @contextlib.contextmanager
    def _reopen(self, name: str) -> Iterator[str]:
        """A path that reads the staged file itself (``/proc/self/fd``), whatever its name holds now."""
        temp, dev, ino = self._staged[name]
        fd = os.open(temp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise VerificationError(f"{self.folder / temp}: replaced by another file while being written")
            proc = f"/proc/self/fd/{fd}"
            yield proc if os.path.exists(proc) else str(self.folder / temp)
        finally:
            os.close(fd)

    def _final_exists(self, name: str) -> bool:
        """Whether final name ``name`` exists (a regular file, to be replaced); refuse anything else."""
        try:
            st = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(
                f"{self.folder / name}: is a symbolic link; refusing to write through it or replace it "
                "(remove the link, or pull into another folder)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(
                f"{self.folder / name}: exists and is not a regular file; refusing to replace it"
            )
        return True

    def publish(self) -> list[Path]:
        """Rename every staged file into place; return the published paths.

        Every final name is checked before the first rename. Where ``renameat2`` is available, a
        failure part-way puts back every name already published (the old file where there was one),
        so the folder is as it was; elsewhere the old files are replaced one by one.
        """
        names = sorted(self._staged)
        replacing = {name: self._final_exists(name) for name in names}
        for name in names:  # the bytes renamed into place are the bytes written and verified
            temp, dev, ino = self._staged[name]
            st = os.stat(temp, dir_fd=self._fd, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != (dev, ino) or not stat.S_ISREG(st.st_mode):
                raise VerificationError(f"{self.folder / temp}: replaced by another file while being written")
        done: list[tuple[str, bool]] = []  # (name, exchanged: the old file now sits at the temp name)
        try:
            for name in names:
                temp = self._staged[name][0]
                flags = RENAME_EXCHANGE if replacing[name] else RENAME_NOREPLACE
                fd = self._fd
                if renameat2(temp, name, flags, src_dir_fd=fd, dst_dir_fd=fd):
                    done.append((name, replacing[name]))
                else:  # no renameat2: a plain rename, which replaces the entry (never a link's target)
                    os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
                    del self._staged[name]
        except BaseException as exc:
            self._roll_back(done)
            if isinstance(exc, OSError):
                raise UsageError(
                    f"{self.folder}: could not rename the staged files into place ({exc.strerror})"
                ) from exc
            raise
        self._published = True
        for name, exchanged in done:
            temp = self._staged.pop(name)[0]
            if exchanged:
                self._unlink(temp)  # the replaced old file
        if self._durable:
            try:
                os.fsync(self._fd)  # the renames themselves
            except OSError as exc:
                raise UsageError(f"{self.folder}: could not flush it ({exc.strerror or exc})") from exc
        return [self.folder / name for name in names]

    def _roll_back(self, done: list[tuple[str, bool]]) -> None:
        for name, exchanged in reversed(done):
            temp = self._staged[name][0]
            try:
                if exchanged:
                    renameat2(temp, name, RENAME_EXCHANGE, src_dir_fd=self._fd, dst_dir_fd=self._fd)
                else:
                    os.rename(name, temp, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            except OSError:
                continue


def write_safetensors(
    arrays: Mapping[str, npt.NDArray[Any]],
    out: Path,
    metadata: Mapping[str, str] | None = None,
    *,
    durable: bool = False,
) -> None:
    """Write ``arrays`` to ``out``; publish only if every tensor reads back exactly (see the module)."""
    with StagedFiles(out.parent, durable=durable) as staged:
        staged.write_safetensors(out.name, arrays, metadata)
        staged.publish()


def write_file(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Replace file ``path`` with ``data`` atomically, the one way (:class:`StagedFiles` of one file).

    A reader sees the old file or the new one, never a part; a symbolic link at ``path`` is refused, not
    followed. Used for shardport's own small files (client state, trust policy).
    """
    if not durable:  # shardport's own files: their folder is made; a user's output file's never is
        path.parent.mkdir(parents=True, exist_ok=True)
    with StagedFiles(path.parent, durable=durable) as staged:
        staged.write_bytes(path.name, data)
        staged.publish()
