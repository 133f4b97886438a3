"""Measured on a rank: which full-size float copies of its quantized weights are alive after preparation.

L5's "no persistent full dequant" used to read the selected kernel's transformation label; this module
measures instead. After the release (:mod:`.release`), :func:`scan_floats` walks everything reachable
from each prepared operator (instance attributes, containers, closures; the walk of
:func:`.release.reachable_spans`) and everything else the rank keeps (its float tensors' container, the
loaded planes it retained), and lists every float buffer -- a numpy array's owning buffer, a torch
tensor's whole storage, on any device -- holding at least as many elements as a quantized weight's
rank-local ``n_local x k_local``:

- reachable from that weight's operator: a full-size float copy of the weight, attributed to it (with
  the operator's ``transformation``: a ``full-dequant`` operator keeps one by design, which the policy
  may allow);
- reachable from what else the rank keeps, at least the smallest quantized weight's size, and not one
  of the model's float weights (norms, float embeddings and heads): unattributed, never allowed.

What it does not see: buffers nothing the rank keeps reaches (a module-level cache); the scan of every
live object (``gc.get_objects``) would, but in a shared process (the in-process bring-up, tests) it also
sees the driver's and other tests' arrays. The evidence (:func:`.up_l5.level5`) holds the list against
the policy. Costs a walk of the operators (~the release's own).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .release import WALK_LIMIT, _owner, reachable_arrays

#: Float buffers of at least this many bytes are looked at (smaller ones cannot be a weight's copy that
#: matters; a 64 x 64 float32 weight is 16 KiB).
MIN_BYTES = 4096


def _buffers(root: object, *, limit: int = WALK_LIMIT) -> Iterable[tuple[int, str, int, int]]:
    """``(address, dtype, elements, bytes)`` of every float buffer reachable from ``root`` (owners, once).

    The walk of :func:`.release.reachable_arrays`; a numpy array by its owning array, a torch tensor
    by its whole storage, on any device.
    """
    for obj in reachable_arrays(root, limit=limit):
        if isinstance(obj, np.ndarray):
            owner = _owner(obj)
            if owner.dtype.kind == "f" and owner.nbytes >= MIN_BYTES:
                yield int(owner.__array_interface__["data"][0]), str(owner.dtype), owner.size, owner.nbytes
            continue
        storage = obj.untyped_storage()
        if obj.is_floating_point() and storage.nbytes() >= MIN_BYTES:
            size = obj.element_size()
            yield storage.data_ptr(), str(obj.dtype), storage.nbytes() // size, storage.nbytes()


def scan_floats(ops: Any, kept: Mapping[str, object] | None = None) -> dict[str, Any]:
    """Full-size float buffers of a rank's prepared operators ``ops`` (a :class:`.rank_ops.RankOps`).

    ``kept``: what else the rank keeps, by name (its loaded planes' object, say). Returns
    ``{operators, buffers, smallest_elements, full_size: [...], seconds}``: ``buffers`` counts every
    float buffer of at least :data:`MIN_BYTES` looked at; each ``full_size`` entry is ``{weight, where,
    transformation, dtype, elements, bytes}`` (``weight`` None: unattributed).
    """
    t0 = time.perf_counter()
    found: list[dict[str, Any]] = []
    looked: set[int] = set()
    sizes: list[int] = []
    for name, phases in sorted(ops.ops.items()):
        attributed: set[int] = set()
        for op in {id(o): o for o in phases.values()}.values():
            need = int(op.op.n_local) * int(op.op.k_local)
            sizes.append(need)
            for addr, dtype, elements, nbytes in _buffers(op):
                looked.add(addr)
                if elements >= need and addr not in attributed:
                    attributed.add(addr)
                    found.append(
                        {
                            "weight": name,
                            "where": "operator",
                            "transformation": op.transformation,
                            "dtype": dtype,
                            "elements": elements,
                            "bytes": nbytes,
                        }
                    )
    smallest = min(sizes, default=0)
    model = {addr for addr, *_ in _buffers(ops.floats)}
    looked |= model
    for where, root in sorted((kept or {}).items()):
        for addr, dtype, elements, nbytes in _buffers(root):
            if addr in looked:
                continue
            looked.add(addr)
            if smallest and elements >= smallest:
                found.append(
                    {
                        "weight": None,
                        "where": where,
                        "transformation": None,
                        "dtype": dtype,
                        "elements": elements,
                        "bytes": nbytes,
                    }
                )
    return {
        "operators": len(sizes),
        "buffers": len(looked),
        "smallest_elements": smallest,
        "full_size": found,
        "seconds": time.perf_counter() - t0,
    }
