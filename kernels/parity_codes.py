"""Parity L1, code preservation: the codes read back out of a kernel's layout vs the planes' codes.

See :mod:`.parity` for the ladder. Read back by the kernel itself (:meth:`~.prepared.PreparedLinear.
code_check`), through a byte map learnt from the packer and held to the kernel on :func:`spot_columns`
(:func:`level1_by_map`), or -- for a layout that keeps the stored planes -- by the kernel's own matmul
on one-hot activations over :func:`spot_columns` (:meth:`~.prepared.PreparedLinear.column_check`);
``not applicable`` with the layout's reason where nothing can be read back.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from .prepared import F32, Codes, PreparedLinear
from .weight import RankWeight


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class L1Codes(_Frozen):
    """Code preservation: codes read back from the layout vs the planes' codes.

    ``readback``: how the codes were read back out of the layout -- ``kernel`` (by the kernel itself,
    or the operand it consumes), ``byte-map`` (through the byte map learnt from the packer, see
    :mod:`.int4_bytemap`), ``byte-map+kernel`` (a sampled ladder: through the byte map, the kernel's
    read-back of :func:`spot_columns` in place of the map's there), ``kernel+byte-map`` (by the kernel,
    and the byte map's read-back compared with it), ``kernel-columns`` (the codes of :func:`spot_columns`
    over every row, by the kernel's own matmul on one-hot activations with unit scales),
    ``kernel-values`` (the binary32 values of those columns by the kernel's matmul, against the
    reference decode's). ``map_mismatches``: codes where the map and the kernel disagree, which fails
    the level. ``applicable`` False: nothing could be read back, ``reason`` says why (``passed`` is then
    True: nothing failed, and the evidence row says "not applicable", not "pass").
    ``max_reconstruction_error``: the preparation's measured conversion error (a record, no tolerance).
    ``columns``/``rows``: the spot columns read back by a ``kernel-columns``/``kernel-values`` check, on
    every row (``rows`` None) or on a sampled ladder's :func:`spot_rows`.
    """

    applicable: bool
    codes_compared: int
    mismatches: int
    first_mismatch: str | None
    representation: str
    max_reconstruction_error: float
    passed: bool
    readback: Literal[
        "kernel", "byte-map", "kernel+byte-map", "byte-map+kernel", "kernel-columns", "kernel-values"
    ] = "kernel"
    map_mismatches: int | None = None
    reason: str | None = None
    columns: int | None = None
    rows: int | None = None


def level1(prepared: PreparedLinear, weight: RankWeight) -> L1Codes:
    """Compare the codes read back through the kernel with the planes' codes, element by element."""
    return _level1(prepared, weight, prepared.code_check(weight))


#: K positions a sampled ladder reads back through the kernel besides the byte map: every residue of
#: this period once (int4pack's tiles along K are at most this wide), spread over the K blocks.
SPOT_PERIOD = 64


def spot_columns(k: int) -> npt.NDArray[np.int64]:
    """Columns of a ``k``-wide weight: every residue mod :data:`SPOT_PERIOD` once, and the tail.

    Each residue sits in another block along K (deterministic).
    """
    blocks = k // SPOT_PERIOD
    if blocks == 0:
        return np.arange(k, dtype=np.int64)
    r = np.arange(SPOT_PERIOD, dtype=np.int64)
    cols = r + SPOT_PERIOD * ((r * 29) % blocks)
    return np.unique(np.concatenate([cols, np.arange(blocks * SPOT_PERIOD, k, dtype=np.int64)]))


#: Rows a sampled ladder's direct-kernel L1 reads the spot columns on: one in this many (and the last).
SPOT_ROW_STRIDE = 8


def spot_rows(n: int) -> npt.NDArray[np.int64]:
    """Every :data:`SPOT_ROW_STRIDE`-th row of an ``n``-row slice from 0, and its last row."""
    return np.unique(np.concatenate([np.arange(0, n, SPOT_ROW_STRIDE), np.arange(max(n - 1, 0), n)]))


def level1_by_map(prepared: PreparedLinear, weight: RankWeight) -> L1Codes:
    """L1 with the codes read back through the layout's byte map where it has one (else the kernel).

    Exact like :func:`level1` (every code, compared as uint8), at the cost of a gather instead of a
    matmul per pair of columns. The map is learnt from the packer, which then packed these bytes, so
    on its own the comparison would only show the map agrees with itself; the kernel therefore also
    reads back :func:`spot_columns` (every K residue of a tile, every row, so every block) and its codes
    replace the map's there: a map wrong anywhere the spot columns reach fails the level against the
    planes, and ``map_mismatches`` counts where map and kernel disagree (readback ``byte-map+kernel``).
    The full ladder of the class's representative compares the two on every code. A layout read back
    by :meth:`~.prepared.PreparedLinear.column_check` (a direct kernel) reads the spot columns on
    :func:`spot_rows` here (every row on the representative's full ladder).
    """
    pair = prepared.map_check(weight)
    if pair is None:
        check = prepared.code_check(weight)
        if check is None:
            return _level1_columns(prepared, weight, None, spot_rows(weight.n_local))
        return _level1(prepared, weight, check)
    expected, mapped = pair
    columns = spot_columns(weight.k_local)
    kernel = prepared.kernel_columns(columns)
    if kernel is None:
        return _level1(prepared, weight, pair, readback="byte-map")
    found = mapped.astype(np.int16)
    found[:, columns] = kernel
    result = _level1(prepared, weight, (expected, found), mapped=mapped)
    return result.model_copy(update={"readback": "byte-map+kernel"})


def where_of(weight: RankWeight, differ: npt.NDArray[np.bool_]) -> tuple[int, int, str]:
    """The first True of ``differ`` (local row, column) and where it is in the full weight."""
    r, k = (int(i) for i in np.argwhere(differ)[0])
    return r, k, f"row {weight.row_start + r} column {weight.col_start + k}"


def _level1(
    prepared: PreparedLinear,
    weight: RankWeight,
    pair: tuple[Codes, Codes] | None,
    *,
    readback: Literal["kernel", "byte-map"] = "kernel",
    mapped: Codes | None = None,
    reference: F32 | None = None,
) -> L1Codes:
    """``pair``: (planes' codes, read-back codes); ``mapped``: the byte map's read-back to hold to it.

    Without a pair: the kernel's reading of :func:`spot_columns` (:func:`_level1_columns`).
    """
    representation = prepared.transformation
    if pair is None:
        return _level1_columns(prepared, weight, reference)
    expected, found = pair
    shaped = expected.shape == found.shape
    differ = expected != found if shaped else np.zeros((0, 0), dtype=np.bool_)
    mismatches = int(np.count_nonzero(differ))
    first = None
    if mismatches:
        r, k, at = where_of(weight, differ)
        first = f"{at}: {expected[r, k]} -> {found[r, k]}"
    map_mismatches = None
    if mapped is not None:
        disagree = mapped != found if mapped.shape == found.shape else np.ones((1, 1), dtype=np.bool_)
        map_mismatches = int(np.count_nonzero(disagree))
        if map_mismatches and first is None:
            r, k, at = where_of(weight, disagree) if disagree.shape == found.shape else (0, 0, "shape")
            first = f"{at}: byte map read back {mapped[r, k]}, the kernel {found[r, k]}"
    return L1Codes(
        applicable=True,
        codes_compared=int(expected.size),
        mismatches=mismatches,
        first_mismatch=first,
        representation=representation,
        max_reconstruction_error=prepared.conversion_error,
        passed=not mismatches and shaped and not map_mismatches,
        readback="kernel+byte-map" if mapped is not None else readback,
        map_mismatches=map_mismatches,
    )


def _level1_columns(
    prepared: PreparedLinear,
    weight: RankWeight,
    reference: F32 | None,
    rows: npt.NDArray[np.int64] | None = None,
) -> L1Codes:
    """L1 without a full read-back: :func:`spot_columns` on every row (or ``rows``), by the kernel.

    Codes or binary32 values (:meth:`~.prepared.PreparedLinear.column_check`), compared exactly (as
    numbers: ``-0.0`` equals ``+0.0``; a NaN equals nothing). Not applicable, with the layout's reason,
    where it reads nothing back.
    """
    columns = spot_columns(weight.k_local)
    check = prepared.column_check(weight, columns, reference, rows) if columns.size else None
    if check is None:
        reason = prepared.no_codes if columns.size else "the slice has no columns"
        return L1Codes(
            applicable=False,
            codes_compared=0,
            mismatches=0,
            first_mismatch=None,
            representation=prepared.transformation,
            max_reconstruction_error=prepared.conversion_error,
            passed=True,
            reason=reason,
        )
    expected, found, quantity = check
    at_rows = np.arange(weight.n_local) if rows is None else rows
    shaped = expected.shape == found.shape == (at_rows.size, columns.size)
    differ = expected != found if shaped else np.ones((1, 1), dtype=np.bool_)
    mismatches = int(np.count_nonzero(differ))
    first = None
    if mismatches and not shaped:
        first = f"shape: expected {list(expected.shape)}, the kernel read back {list(found.shape)}"
    elif mismatches:
        r, c = (int(i) for i in np.argwhere(differ)[0])
        at = f"row {weight.row_start + int(at_rows[r])} column {weight.col_start + int(columns[c])}"
        first = f"{at}: {quantity[:-1]} {expected[r, c]!r} -> {found[r, c]!r}"
    return L1Codes(
        applicable=True,
        codes_compared=int(expected.size),
        mismatches=mismatches,
        first_mismatch=first,
        representation=prepared.transformation,
        max_reconstruction_error=prepared.conversion_error,
        passed=not mismatches,
        readback="kernel-columns" if quantity == "codes" else "kernel-values",
        columns=int(columns.size),
        rows=None if rows is None else int(rows.size),
    )
