"""Semantic check at load: a rank re-decodes the decode-witness rows that fall in its slice.

The witness (rows of the producer's reference decode, signed in the manifest) is compared with a
decode of the bytes this rank actually loaded. The rank's slices of each plane are placed into a
zero-filled plane of the full shape (one weight at a time, dropped right after), the weight is decoded
for the witness rows inside the rank's output range with the registry's reference decoder, and the
columns inside the rank's input range must equal the witness exactly. Placement keeps splits on
group and block boundaries, so every value compared depends only on bytes the rank holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from shardport.placement.plan import TensorRead
from shardport.registry.contracts import LogicalWeight, decode_weight
from shardport.registry.contracts.witness import compare_witness, witness_values
from shardport.registry.manifest import TensorEntry


def _place(
    full: npt.NDArray[np.uint8], entry: TensorEntry, read: TensorRead, data: npt.NDArray[np.uint8]
) -> None:
    nbytes = entry.end - entry.start
    if len(entry.shape) >= 2:
        rows = entry.shape[0]
        row_bytes = nbytes // rows
        (r0, r1), (c0, _c1) = read.index[0], read.index[1]
        block = data.reshape(r1 - r0, -1)
        first = c0 * row_bytes // entry.shape[1]
        full.reshape(rows, row_bytes)[r0:r1, first : first + block.shape[1]] = block
    else:
        c0 = read.index[0][0]
        per = nbytes // max(1, entry.shape[0]) if entry.shape else nbytes
        full[c0 * per : c0 * per + data.size] = data


def check_rank_witnesses(
    weights: Sequence[LogicalWeight],
    entries: Mapping[str, TensorEntry],
    loaded: Sequence[tuple[TensorRead, npt.NDArray[np.uint8]]],
) -> int:
    """Re-decode the witness rows inside this rank's slices; return how many rows were compared.

    Raises :class:`~shardport.registry.contracts.errors.WitnessMismatchError` on any difference.
    """
    by_weight: dict[str, list[tuple[TensorRead, npt.NDArray[np.uint8]]]] = {}
    for read, data in loaded:
        if read.weight:
            by_weight.setdefault(read.weight, []).append((read, data))
    compared = 0
    for w in weights:
        parts = by_weight.get(w.name)
        if w.witness is None or not parts or len(w.shape.extents) != 2:
            continue
        have = {r.tensor for r, _ in parts}
        if any(p.tensor not in have for p in w.planes if p.role != "shape"):
            continue
        main = next((r for r, _ in parts if r.role in ("codes", "float")), parts[0][0])
        (n0, n1), (k0, k1) = main.slice.bounds[-2], main.slice.bounds[-1]
        rows = [i for i, r in enumerate(w.witness.rows) if n0 <= r < n1]
        if not rows:
            continue
        planes: dict[str, npt.NDArray[np.uint8]] = {}
        for read, data in parts:
            entry = entries[read.tensor]
            full = planes.setdefault(read.tensor, np.zeros(entry.end - entry.start, dtype=np.uint8))
            _place(full, entry, read, data.reshape(-1))
        with np.errstate(all="ignore"):  # zero-filled parts outside the slice are never compared
            decoded = decode_weight(w, planes, [w.witness.rows[i] for i in rows])
        expected = witness_values(w.witness)[rows][:, k0:k1]
        found = np.ascontiguousarray(decoded[:, k0:k1])
        _compare(w, expected, found, [w.witness.rows[i] for i in rows])
        compared += len(rows)
    return compared


def _compare(
    w: LogicalWeight, expected: npt.NDArray[np.float32], found: npt.NDArray[np.float32], rows: list[int]
) -> None:
    import base64
    import hashlib

    from shardport.registry.contracts import DecodeWitness

    raw = np.ascontiguousarray(expected, dtype="<f4").tobytes()
    partial = DecodeWitness(
        seed=w.witness.seed if w.witness else 0,
        rows=tuple(rows),
        columns=expected.shape[1],
        values_f32le=base64.b64encode(raw).decode("ascii"),
        values_sha256=hashlib.sha256(raw).hexdigest(),
        rel_error=None,
    )
    compare_witness(partial, found, tensor=w.name)
