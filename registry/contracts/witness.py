"""Decode witnesses (DESIGN.md "Decode witness"): digests of the reference decode that every rank meets.

A witness (:class:`~.model.CellWitness`) records, for a grid of *cells* — one row and up to 32 columns
of it, starting on the weight's alignment along K — the first 4 bytes of sha256 of the cell's binary32
reference decode, per expert. The grid has a row every ``N // 16`` rows (plus the last row) and a cell
start every ``blocks // 16`` alignment blocks (plus the last), paired diagonally, so:

- a column (output-dim) split gives each rank at least ``N / 16`` rows at tp <= 8 (the planner moves
  split points by whole alignment units and gives each rank at least one), which hold a grid row, and
  each rank holds every column of its rows;
- a row (input-dim) split gives each rank a K range of whole alignment blocks, at least ``K / 16``
  long, which holds a cell start — and all rows;
- stacked experts ``[E, N, K]`` have the grid in every expert, so every ep rank meets its experts'.

Every consumer re-decodes the cells it holds and compares digests (:func:`check_witness`,
:func:`check_cells`); a contract that reads the right bytes the wrong way — a swapped nibble order —
passes every structural gate but fails here. The seed (from the weight's name) only picks the grid's
phase. Witnesses of manifests written before cells (:class:`~.model.DecodeWitness`: whole rows of
binary32 values) are still checked.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from .decode import decode_weight
from .errors import WitnessMismatchError
from .gguf_blocks import BLOCK_SIZES
from .model import (
    CELL_DIGEST_BYTES,
    AffineIntContract,
    CellWitness,
    DecodeWitness,
    GgufBlockContract,
    GroupMapIndex,
    LogicalWeight,
    MicroscaleContract,
    cell_positions,
)
from .rounding import reference_gate

F32 = npt.NDArray[np.float32]
Planes = Mapping[str, npt.NDArray[np.generic]]
Range = tuple[int, int]

#: Grid segments per axis: every rank of a split at tp <= 8 holds at least 1/16 of the split axis.
SEGMENTS = 16
#: Columns per cell at most (a cell never crosses an alignment block).
MAX_CELL_WIDTH = 32


def witness_alignment(weight: LogicalWeight) -> int:
    """Columns per alignment block along K: the lcm of the group size, GGUF block and packed word.

    Every split point the planner puts on K is a multiple of it, so a cell inside one block is held
    whole by any rank whose K range holds its first column.
    """
    contract = weight.contract
    unit = 1
    if isinstance(contract, GgufBlockContract):
        unit = BLOCK_SIZES[contract.ggml_type][0]
    elif isinstance(contract, AffineIntContract | MicroscaleContract):
        act_order = isinstance(contract.group_map, GroupMapIndex) and not contract.group_map.sequential
        if not act_order:
            unit = math.lcm(unit, contract.scales.group_size)
        codes = contract.codes
        if codes.packing.axis == "K":
            unit = math.lcm(
                unit, codes.packing.container_bits // math.gcd(codes.bits, codes.packing.container_bits)
            )
    return min(unit, weight.shape.columns)


def _axis_grid(extent: int, phase_seed: int) -> tuple[int, int, int]:
    stride = max(1, extent // SEGMENTS)
    first = phase_seed % stride
    return first, stride, (extent - 1 - first) // stride + 1


def _experts_and_rows(weight: LogicalWeight) -> tuple[int, int]:
    shape = weight.shape
    if shape.axes[0] == "E":
        return shape.extents[0], shape.extents[1]
    return 1, shape.extents[0]


def cell_digest(values: npt.NDArray[np.float32]) -> bytes:
    """The first 4 bytes of sha256 of ``values`` as little-endian binary32."""
    raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
    return hashlib.sha256(raw).digest()[:CELL_DIGEST_BYTES]


def _cell_table(
    weight: LogicalWeight, witness: CellWitness, planes: Planes, experts: Sequence[int]
) -> dict[tuple[int, int], bytes]:
    """Digest of every cell of ``experts``, keyed by (expert, cell index)."""
    cells = cell_positions(witness)
    rows = sorted({e * witness.rows + r for e in experts for r, _, _ in cells})
    if not rows:
        return {}
    decoded = decode_weight(weight, planes, rows)
    at = {row: i for i, row in enumerate(rows)}
    return {
        (e, i): cell_digest(decoded[at[e * witness.rows + r], c0:c1])
        for e in experts
        for i, (r, c0, c1) in enumerate(cells)
    }


def make_witness(
    weight: LogicalWeight, planes: Planes, seed: int, *, reference: F32 | None = None
) -> CellWitness:
    """Decode the weight's witness cells with the reference decoder and record their digests.

    With ``reference`` (the float weight, logical shape), every row of the decode is held to the
    honest rounding bound of :mod:`.rounding` and the relative error is recorded.
    """
    experts, rows = _experts_and_rows(weight)
    columns = weight.shape.columns
    align = witness_alignment(weight)
    blocks = -(-columns // align)
    grid = CellWitness.model_construct(
        kind="cells",
        seed=seed,
        experts=experts,
        rows=rows,
        columns=columns,
        align=align,
        width=min(align, MAX_CELL_WIDTH),
        row_grid=_axis_grid(rows, seed),
        block_grid=_axis_grid(blocks, seed >> 24),
        digests="",
        rel_error=None,
    )
    table = _cell_table(weight, grid, planes, range(experts))
    raw = b"".join(table[key] for key in sorted(table))
    rel_error = reference_gate(weight, planes, reference) if reference is not None else None
    return CellWitness.model_validate(
        {**grid.model_dump(), "digests": base64.b64encode(raw).decode("ascii"), "rel_error": rel_error}
    )


def _stored(witness: CellWitness) -> dict[tuple[int, int], bytes]:
    raw = base64.b64decode(witness.digests, validate=True)
    count = len(cell_positions(witness))
    size = CELL_DIGEST_BYTES
    return {
        (e, i): raw[(e * count + i) * size : (e * count + i + 1) * size]
        for e in range(witness.experts)
        for i in range(count)
    }


def _fits(weight: LogicalWeight, witness: CellWitness) -> None:
    experts, rows = _experts_and_rows(weight)
    if (witness.experts, witness.rows, witness.columns) != (experts, rows, weight.shape.columns):
        raise WitnessMismatchError(
            weight.name,
            "witness extents (experts, rows, columns)",
            (experts, rows, weight.shape.columns),
            (witness.experts, witness.rows, witness.columns),
            "the witness belongs to another weight",
        )


def check_cells(
    weight: LogicalWeight,
    witness: CellWitness,
    planes: Planes,
    *,
    experts: Range | None = None,
    rows: Range | None = None,
    columns: Range | None = None,
) -> int:
    """Re-decode the cells inside the box ``experts`` x ``rows`` x ``columns`` and compare digests.

    Ranges default to the whole axis. A cell counts when its row is inside and its columns are wholly
    inside. Returns the cells compared; raises :class:`WitnessMismatchError` naming the first differing
    cell.
    """
    _fits(weight, witness)
    e0, e1 = experts or (0, witness.experts)
    n0, n1 = rows or (0, witness.rows)
    k0, k1 = columns or (0, witness.columns)
    inside = [
        i for i, (r, c0, c1) in enumerate(cell_positions(witness)) if n0 <= r < n1 and k0 <= c0 and c1 <= k1
    ]
    if not inside or e0 >= e1:
        return 0
    cells = cell_positions(witness)
    wanted = sorted({e * witness.rows + cells[i][0] for e in range(e0, e1) for i in inside})
    decoded = decode_weight(weight, planes, wanted)
    at = {row: j for j, row in enumerate(wanted)}
    stored = _stored(witness)
    for e in range(e0, e1):
        for i in inside:
            r, c0, c1 = cells[i]
            got = cell_digest(decoded[at[e * witness.rows + r], c0:c1])
            if got != stored[(e, i)]:
                where = f"expert {e} " if witness.experts > 1 else ""
                raise WitnessMismatchError(
                    weight.name,
                    f"witness cell {where}row {r} columns {c0}..{c1 - 1}",
                    f"decode digest {stored[(e, i)].hex()} (seed {witness.seed})",
                    f"{got.hex()}",
                    "this decode reads the planes differently from the producer (check slot order, "
                    "zero-point convention and scale format), or the bytes changed",
                )
    return len(inside) * (e1 - e0)


def relative_error(decoded: F32, reference: F32) -> float:
    """Return ``||decoded - reference|| / ||reference||`` (Frobenius, in float64)."""
    diff = np.asarray(decoded, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    norm = float(np.linalg.norm(np.asarray(reference, dtype=np.float64)))
    return float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff))


def witness_values(witness: DecodeWitness) -> F32:
    """Return the rows of a (pre-cells) whole-row witness as a binary32 array ``[len(rows), columns]``."""
    raw = base64.b64decode(witness.values_f32le, validate=True)
    return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(len(witness.rows), witness.columns)


def compare_witness(
    witness: DecodeWitness,
    decoded_rows: F32,
    *,
    tensor: str = "<weight>",
    atol: float = 0.0,
    rtol: float = 0.0,
) -> None:
    """Compare a consumer's decode of a whole-row witness's rows with it (exact by default).

    Exact means equal binary32 values (+0 equals -0; NaN matches NaN). Raises :class:`WitnessMismatchError`
    naming the first differing element.
    """
    expected = witness_values(witness)
    found = np.asarray(decoded_rows, dtype=np.float32)
    if found.shape != expected.shape:
        raise WitnessMismatchError(tensor, "witness rows shape", list(expected.shape), list(found.shape))
    both_nan = np.isnan(expected) & np.isnan(found)
    if atol == 0.0 and rtol == 0.0:
        equal = (expected == found) | both_nan
    else:
        equal = np.isclose(found, expected, atol=atol, rtol=rtol) | both_nan
    if not equal.all():
        r, c = (int(i) for i in np.argwhere(~equal)[0])
        raise WitnessMismatchError(
            tensor,
            f"row {witness.rows[r]} column {c}",
            f"{expected[r, c]!r} (seed {witness.seed})",
            f"{found[r, c]!r}; {int((~equal).sum())} of {equal.size} elements differ",
            "this decode reads the planes differently from the producer: check slot order, zero-point "
            "convention and scale format",
        )


def check_witness(
    weight: LogicalWeight, planes: Planes, witness: DecodeWitness | CellWitness | None = None
) -> int:
    """Re-decode every witness cell (or whole-row witness row) with the reference decoder and compare.

    Returns the cells (rows) compared.
    """
    chosen = witness if witness is not None else weight.witness
    if chosen is None:
        raise WitnessMismatchError(
            weight.name,
            "witness",
            "a decode witness",
            "none",
            "push records one per weight; re-push the artifact",
        )
    if isinstance(chosen, CellWitness):
        return check_cells(weight, chosen, planes)
    rows, columns = weight.shape.rows, weight.shape.columns
    if chosen.columns != columns or max(chosen.rows) >= rows:
        raise WitnessMismatchError(
            weight.name,
            "witness rows/columns",
            f"rows < {rows} and {columns} columns",
            f"rows up to {max(chosen.rows)} and {chosen.columns} columns",
            "the witness belongs to another weight",
        )
    compare_witness(chosen, decode_weight(weight, planes, chosen.rows), tensor=weight.name)
    return len(chosen.rows)
