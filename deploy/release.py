"""A rank keeps only what it runs: release the loaded planes its prepared operators do not use.

After preparation (dispatch, repack, the parity ladder) a rank's loaded planes
(:class:`~shardport.loader.RankTensors`) are read only where an operator or a float tensor uses them in
place: the GGUF direct kernel's block planes, int8pack's codes (a view of the loaded bytes), the
reference kernel's planes, float tensors decoded as views (F32 norms). Every other plane -- the codes
and qparams int4pack repacked into its own layout, those a full dequantization decoded, scales copied
into the activation dtype -- is a second copy nobody reads after the ladder.

:class:`PlaneRelease` records each loaded buffer without holding it: a weak reference to the array
owning its memory (a view, and so an operator holding one row of a plane, keeps the whole buffer
alive; the loader gives each tensor its own buffer), and whether anything reachable from the kept
object (the rank's operators and float tensors) points into it: the address range of every numpy
array and CPU torch tensor reachable from it, overlapping the buffer's. Its :attr:`~PlaneRelease.metadata`
is the rank's tensors without the tensors (digest, plan, read ledger, witness counts: what the report
still reads). The caller drops its own references to the planes, then :meth:`~PlaneRelease.measure`
counts what is still alive -- after a full garbage collection only when a buffer nothing should reach
survives (a reference cycle: a traceback's frames hold their locals) -- and hands freed heap back to
the system (glibc ``malloc_trim``). :class:`PlaneBytes` says what was loaded, retained, shared and
released; a rank that keeps a plane its operators do not use shows it as ``codes_retained_unused``
and fails L5 (:func:`~.up_evidence.level5`).
"""

from __future__ import annotations

import dataclasses
import gc
import time
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardport.loader import RankTensors

#: Objects walked from the kept object at most (a rank's operators and floats are a few thousand).
WALK_LIMIT = 1_000_000
_LEAVES = (type, types.ModuleType, str, bytes, bytearray, int, float, complex, bool, type(None))


@dataclass(frozen=True, slots=True)
class PlaneBytes:
    """A rank's loaded plane bytes after preparation (each tensor counted by its loaded size).

    ``loaded``: what the rank loaded (``codes_and_qparams``); ``retained``: still held after the
    release (its owning array alive, or its memory used in place by what the rank keeps -- a buffer
    used through ``torch.frombuffer`` outlives its array); ``shared``: used in place by what the rank
    keeps (also counted in the prepared operators' or float tensors' bytes); ``unused``: alive, and
    used by nothing the rank keeps (a second copy: 0 after a clean release); ``seconds``: the release's
    own time (the walk, the collection, the trim). Each buffer counts once, by its own state: a used
    buffer never offsets an unused one.
    """

    loaded: int
    retained: int
    shared: int
    unused: int
    seconds: float

    @property
    def released(self) -> int:
        """Loaded bytes handed back."""
        return self.loaded - self.retained

    def ledger(self) -> dict[str, int]:
        """The rank ledger's entries (bytes)."""
        return {
            "codes_retained": self.retained,
            "codes_shared": self.shared,
            "codes_released": self.released,
            "codes_retained_unused": self.unused,
        }


@dataclass(frozen=True, slots=True)
class _Buffer:
    owner: weakref.ref[np.ndarray[Any, Any]]
    nbytes: int
    """The loaded tensors' bytes in this buffer."""
    shared: bool


def _owner(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The array owning ``array``'s memory (the last array of its ``base`` chain)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _span(array: np.ndarray[Any, Any]) -> tuple[int, int]:
    start = int(array.__array_interface__["data"][0])
    return start, start + int(array.nbytes)


def reachable_arrays(root: object, *, limit: int = WALK_LIMIT) -> Iterator[Any]:
    """Every numpy array and torch tensor reachable from ``root``, each object once.

    Walks the garbage collector's referents (instance attributes, containers, closures' cells), not
    into modules, classes or a function's globals, and not into an array or tensor. Stops after
    ``limit`` objects.
    """
    import torch

    seen: set[int] = set()
    stack: list[object] = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray | torch.Tensor):
            yield obj
            continue
        if isinstance(obj, types.FunctionType):  # its closure and defaults, never its module's globals
            stack += [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
            stack += list(obj.__defaults__ or ())
            continue
        stack += gc.get_referents(obj)


def reachable_spans(root: object, *, limit: int = WALK_LIMIT) -> list[tuple[int, int]]:
    """Address ranges ``[start, end)`` of every numpy array and CPU torch tensor reachable from ``root``.

    The walk of :func:`reachable_arrays`. A torch tensor counts by its whole storage (a tensor made from
    a numpy array shares that array's memory).
    """
    spans: list[tuple[int, int]] = []
    for obj in reachable_arrays(root, limit=limit):
        if isinstance(obj, np.ndarray):
            if obj.nbytes:
                spans.append(_span(obj))
        elif obj.device.type == "cpu" and obj.untyped_storage().nbytes():
            storage = obj.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return spans


def _overlaps(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(s < span[1] and span[0] < e for s, e in spans)


class PlaneRelease:
    """One rank's loaded planes, watched without being held: which are shared, which still alive.

    Build it while the caller still holds ``loaded`` (``keep``: what the rank keeps after preparation,
    its operators and float tensors); drop every reference to ``loaded`` except :attr:`metadata`; then
    :meth:`measure`.
    """

    def __init__(self, loaded: RankTensors, keep: object) -> None:
        t0 = time.perf_counter()
        spans = reachable_spans(keep)
        sizes: dict[int, int] = {}
        owners: dict[int, np.ndarray[Any, Any]] = {}
        for t in loaded.tensors:
            owner = _owner(t.array)
            owners[id(owner)] = owner
            sizes[id(owner)] = sizes.get(id(owner), 0) + int(t.array.nbytes)
        self._buffers = [
            _Buffer(weakref.ref(o), sizes[key], _overlaps(_span(o), spans)) for key, o in owners.items()
        ]
        del owners
        self.loaded = int(loaded.bytes_assigned)
        self.metadata: RankTensors = dataclasses.replace(loaded, tensors=())
        """The rank's tensors without the tensors: digest, plan, read ledger, witness counts."""
        self._seconds = time.perf_counter() - t0

    def _alive(self) -> list[_Buffer]:
        return [b for b in self._buffers if b.owner() is not None]

    def measure(self) -> PlaneBytes:
        """What is retained now; freed heap handed back to the system.

        A full garbage collection runs first only if a buffer nothing kept reaches is still alive.
        """
        t0 = time.perf_counter()
        if any(not b.shared for b in self._alive()):
            gc.collect()  # a reference cycle may still hold one (a traceback's frames)
        alive = self._alive()
        _trim()
        return PlaneBytes(
            loaded=self.loaded,
            retained=sum(b.nbytes for b in self._buffers if b.shared or b.owner() is not None),
            shared=sum(b.nbytes for b in self._buffers if b.shared),
            unused=sum(b.nbytes for b in alive if not b.shared),
            seconds=self._seconds + time.perf_counter() - t0,
        )


def _trim() -> None:
    """Hand freed heap back to the system (glibc ``malloc_trim(0)``; nothing elsewhere)."""
    import ctypes

    from shardport.registry.store.libc import libc_function

    trim = libc_function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])
    if callable(trim):
        trim(0)
