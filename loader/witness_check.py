"""Semantic check at load: a rank re-decodes the decode-witness cells that fall in its slice.

The witness (digests of the producer's reference decode over a grid of cells, signed in the manifest)
is compared with a decode of the bytes this rank actually loaded. The rank's slices of each plane are
placed into a zero-filled plane of the full shape (one weight at a time, dropped right after), the
weight is decoded for the witness rows inside the rank's slice (experts, output range) with the
registry's reference decoder, and the digest of every cell wholly inside its input range must match.
Placement keeps splits on group and block boundaries, so every value compared depends only on bytes
the rank holds; the grid puts a cell inside every rank's slice at every supported split.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardport.placement.plan import TensorRead
from shardport.registry.artifact.manifest import TensorEntry
from shardport.registry.artifact.witness_file import ProducerWitness, check_producer_box
from shardport.registry.contracts import CellWitness, DecodeWitness, LogicalWeight, decode_weight
from shardport.registry.contracts.witness import check_cells, compare_witness, witness_values

Range = tuple[int, int]


def _place(
    full: npt.NDArray[np.uint8], entry: TensorEntry, read: TensorRead, data: npt.NDArray[np.uint8]
) -> None:
    """Copy a rank's slice of a plane (any rank of dims) into the zero-filled plane ``full``."""
    nbytes = entry.end - entry.start
    if len(entry.shape) >= 2:
        lead = entry.shape[:-1]
        row_bytes = nbytes // max(1, int(np.prod(lead)))
        c0 = read.index[-1][0]
        first = c0 * row_bytes // entry.shape[-1]
        block = data.reshape(*(b - a for a, b in read.index[:-1]), -1)
        where = tuple(slice(a, b) for a, b in read.index[:-1])
        full.reshape(*lead, row_bytes)[(*where, slice(first, first + block.shape[-1]))] = block
    else:
        c0 = read.index[0][0]
        per = nbytes // max(1, entry.shape[0]) if entry.shape else nbytes
        full[c0 * per : c0 * per + data.size] = data


def check_rank_witnesses(
    weights: Sequence[LogicalWeight],
    entries: Mapping[str, TensorEntry],
    loaded: Sequence[tuple[TensorRead, npt.NDArray[np.uint8]]],
    producer: ProducerWitness | None = None,
) -> WitnessCount:
    """Re-decode the witness cells inside this rank's slices; return what was compared.

    Every quantized weight the rank loads has a witness cell inside its slice (see
    :mod:`shardport.registry.contracts.witness`); a weight with a witness and none inside is counted in
    ``WitnessCount.unchecked``. The producer's witness rows (``push --witness``) inside the slice are held
    to the rounding bound of their elements. Raises
    :class:`~shardport.registry.contracts.errors.WitnessMismatchError` on any difference.
    """
    by_weight: dict[str, list[tuple[TensorRead, npt.NDArray[np.uint8]]]] = {}
    for read, data in loaded:
        if read.weight:
            by_weight.setdefault(read.weight, []).append((read, data))
    cells = weights_checked = producer_rows = 0
    unchecked: list[str] = []
    for w in weights:
        parts = by_weight.get(w.name)
        produced = producer is not None and w.name in producer.rows
        if not parts or (w.witness is None and not produced):
            continue
        have = {r.tensor for r, _ in parts}
        if any(p.tensor not in have for p in w.planes if p.role != "shape"):
            unchecked.append(w.name)
            continue
        main = next((r for r, _ in parts if r.role in ("codes", "float")), parts[0][0])
        box = dict(zip(main.slice.axes, main.slice.bounds, strict=True))
        planes: dict[str, npt.NDArray[np.uint8]] = {}
        for read, data in parts:
            entry = entries[read.tensor]
            full = planes.setdefault(read.tensor, np.zeros(entry.end - entry.start, dtype=np.uint8))
            _place(full, entry, read, data.reshape(-1))
        n = 0
        with np.errstate(all="ignore"):  # zero-filled parts outside the slice are never compared
            if isinstance(w.witness, CellWitness):
                n = check_cells(
                    w, w.witness, planes, experts=box.get("E"), rows=box.get("N"), columns=box.get("K")
                )
            elif w.witness is not None:
                n = _check_rows(w, w.witness, planes, box)
            if producer is not None:
                producer_rows += check_producer_box(producer, w, planes, box)
        if w.witness is None:
            continue
        if n:
            cells += n
            weights_checked += 1
        else:
            unchecked.append(w.name)
    return WitnessCount(cells, weights_checked, tuple(unchecked), producer_rows)


@dataclass(frozen=True)
class WitnessCount:
    """What one rank's witness check compared.

    ``cells`` (rows, for a whole-row witness), the ``weights`` checked, the weights it loaded with a
    witness of which no cell lay inside its slice (``unchecked``), and producer witness rows.
    """

    cells: int
    weights: int
    unchecked: tuple[str, ...]
    producer_rows: int = 0


def _check_rows(
    w: LogicalWeight,
    witness: DecodeWitness,
    planes: Mapping[str, npt.NDArray[np.uint8]],
    box: Mapping[str, Range],
) -> int:
    """A whole-row witness (manifests written before cells): the rows inside the slice, its columns."""
    if len(w.shape.extents) != 2:
        return 0
    (n0, n1), (k0, k1) = box["N"], box["K"]
    rows = [i for i, r in enumerate(witness.rows) if n0 <= r < n1]
    if not rows:
        return 0
    decoded = decode_weight(w, planes, [witness.rows[i] for i in rows])
    expected = witness_values(witness)[rows][:, k0:k1]
    found = np.ascontiguousarray(decoded[:, k0:k1])
    raw = np.ascontiguousarray(expected, dtype="<f4").tobytes()
    partial = DecodeWitness(
        seed=witness.seed,
        rows=tuple(witness.rows[i] for i in rows),
        columns=expected.shape[1],
        values_f32le=base64.b64encode(raw).decode("ascii"),
        values_sha256=hashlib.sha256(raw).hexdigest(),
        rel_error=None,
    )
    compare_witness(partial, found, tensor=w.name)
    return len(rows)
