"""The one loader of C library functions (Linux system calls Python does not wrap).

Used for ``renameat2`` (:mod:`shardport.registry.output.writers`) and, by the loader, ``syscall``
(``cachestat``), ``mincore`` and friends. A function the C library lacks (not Linux/glibc) is None:
callers fall back.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _library() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)  # the C library this process already has loaded
    except OSError:  # pragma: no cover - no dynamic C library
        return None


def libc_function(name: str, restype: type | None, argtypes: list[type] | None = None) -> object | None:
    """C library function ``name`` (errno kept, ``restype``/``argtypes`` set), or None where it is absent."""
    lib = _library()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return None
    fn.restype = restype
    if argtypes is not None:
        fn.argtypes = argtypes
    return fn  # type: ignore[no-any-return]
