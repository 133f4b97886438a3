"""Linux calls for local reads: ``cachestat``, ``mincore``, ``O_DIRECT`` arithmetic, anonymous memory."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os

import numpy as np

from shardport.registry.store.libc import libc_function

from ..bands import DIRECT_MIN

try:
    IOV_MAX = int(os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError):  # pragma: no cover - every Linux has it
    IOV_MAX = 1024
SINK_BYTES = 64 << 10
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
PAGE = mmap.PAGESIZE


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_NR_CACHESTAT = 451  # the same number on every architecture (Linux 6.5+)


_SYSCALL = libc_function("syscall", ctypes.c_long)  # variadic: arguments typed at the call
_cachestat_ok = _SYSCALL is not None and os.uname().sysname == "Linux"


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """How many pages of ``[offset, offset + length)`` of ``fd`` are in the page cache (``cachestat``).

    None where the kernel cannot say (before Linux 6.5) or will not (recent kernels report, as for
    ``mincore``, only on files the caller owns or may write): the caller then assumes cached. One system
    call, no mapping, nothing brought in.
    """
    global _cachestat_ok
    if not _cachestat_ok:
        return None
    if length <= 0:
        return 0
    rng, stat = _CacheStatRange(offset, length), _CacheStat()
    call = _SYSCALL
    assert call is not None
    ret = call(  # type: ignore[operator]
        ctypes.c_long(_NR_CACHESTAT),
        ctypes.c_uint(fd),
        ctypes.byref(rng),
        ctypes.byref(stat),
        ctypes.c_uint(0),
    )
    if ret != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _cachestat_ok = False  # not this kernel, or not for this caller: stop asking
        return None
    return int(stat.nr_cache)


def direct_middle(offset: int, length: int) -> tuple[int, int] | None:
    """The whole pages ``[a, b)`` inside file bytes ``[offset, offset + length)``, if worth O_DIRECT.

    None below :data:`~.bands.DIRECT_MIN` bytes.
    """
    a, b = -(-offset // PAGE) * PAGE, (offset + length) // PAGE * PAGE
    return (a, b) if b - a >= DIRECT_MIN else None


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def anonymous(nbytes: int, *, huge: bool = False) -> mmap.mmap:
    """``nbytes`` (page-rounded, at least a page) of private anonymous memory, page-aligned.

    Private: ``mmap.mmap(-1, n)`` alone maps *shared* anonymous memory (tmpfs pages), which faulted in
    at a third of the speed here (a fresh 64 MiB destination filled from the page cache: 1.5 GB/s shared,
    2.0 private). ``huge``: advised for transparent huge pages, as numpy does for its own large arrays
    (a 2 MiB page per fault: 5.3 GB/s); for result arrays, not for reused buffers whose resident size
    should stay what they touch.
    """
    mapping = mmap.mmap(-1, max(PAGE, -(-nbytes // PAGE) * PAGE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages: small pages
            mapping.madvise(mmap.MADV_HUGEPAGE)
    return mapping


_MINCORE = libc_function("mincore", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
