"""Decode witnesses (DESIGN.md "Decode witness"): a few seeded rows of the reference decode.

The producer records a seed, the rows it picked from that seed, those rows' binary32 reference decode
(little-endian, base64, with a sha256) and, when it had a float reference, the relative error to it.
Every consumer re-decodes the same rows its own way and compares (:func:`compare_witness`), or lets
the reference decoder do it (:func:`check_witness`). A contract that reads the right bytes the wrong
way — e.g. a swapped nibble order — passes every structural gate but fails here.

Row choice is a pure function of (seed, row count): ``sha256("<seed>:<i>")`` modulo the row count,
skipping repeats, so it never depends on a random-number library's version.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .decode import decode_weight
from .errors import ReferenceErrorTooLargeError, WitnessMismatchError
from .model import AffineIntContract, DecodeWitness, LogicalWeight

F32 = npt.NDArray[np.float32]
Planes = Mapping[str, npt.NDArray[np.generic]]

#: Relative-error budget numerator: honest b-bit decodes stay below ``REFERENCE_ERROR_SCALE / (2^b - 1)``.
REFERENCE_ERROR_SCALE = 3.5


def choose_rows(total: int, seed: int, count: int = 4) -> tuple[int, ...]:
    """Return ``min(count, total)`` distinct row indices, sorted, chosen from ``seed``."""
    wanted = min(count, total)
    chosen: list[int] = []
    attempt = 0
    while len(chosen) < wanted:
        digest = hashlib.sha256(f"{seed}:{attempt}".encode()).digest()
        row = int.from_bytes(digest[:8], "little") % total
        if row not in chosen:
            chosen.append(row)
        attempt += 1
    return tuple(sorted(chosen))


def relative_error(decoded: F32, reference: F32) -> float:
    """Return ``||decoded - reference|| / ||reference||`` (Frobenius, in float64)."""
    diff = np.asarray(decoded, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    norm = float(np.linalg.norm(np.asarray(reference, dtype=np.float64)))
    return float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff))


def reference_error_gate(
    decoded_rows: F32,
    reference_rows: F32,
    bits: int,
    *,
    tensor: str = "<weight>",
    max_rel_error: float | None = None,
) -> float:
    """Refuse a decode far farther from the float reference than ``bits`` allows; return the error.

    The default budget is ``3.5 / (2^bits - 1)`` (23% at 4 bits, 1.4% at 8). Honest group-wise b-bit
    quantization of Gaussian to heavy-tailed weights lands near ``1.5-2.2 / (2^b - 1)`` (10-15% at
    4 bits); a mislabelled zero-point convention shifts every element by a whole step, about
    ``5.4-7.8 / (2^b - 1)`` (36-52% at 4 bits).
    """
    error = relative_error(decoded_rows, reference_rows)
    budget = max_rel_error if max_rel_error is not None else REFERENCE_ERROR_SCALE / ((1 << bits) - 1)
    if not error <= budget:
        raise ReferenceErrorTooLargeError(
            tensor,
            "relative error to the float reference",
            f"<= {budget:.4f} for {bits}-bit codes",
            f"{error:.4f}",
            "the decode does not reproduce the weights; check the zero-point convention, slot order and "
            "scale format of the contract",
        )
    return error


def _rows_of(weight: LogicalWeight, reference: F32) -> F32:
    return np.asarray(reference, dtype=np.float32).reshape(weight.shape.rows, weight.shape.columns)


def make_witness(
    weight: LogicalWeight,
    planes: Planes,
    seed: int,
    *,
    count: int = 4,
    reference: F32 | None = None,
) -> DecodeWitness:
    """Decode ``count`` seeded rows with the reference decoder and record them.

    With ``reference`` (the float weight, logical shape), the relative error of those rows is measured
    and, for integer contracts, held to :func:`reference_error_gate`.
    """
    rows = choose_rows(weight.shape.rows, seed, count)
    values = np.ascontiguousarray(decode_weight(weight, planes, rows), dtype="<f4")
    rel_error: float | None = None
    if reference is not None:
        wanted = _rows_of(weight, reference)[list(rows)]
        if isinstance(weight.contract, AffineIntContract):
            rel_error = reference_error_gate(values, wanted, weight.contract.codes.bits, tensor=weight.name)
        else:
            rel_error = relative_error(values, wanted)
    raw = values.tobytes()
    return DecodeWitness(
        seed=seed,
        rows=rows,
        columns=weight.shape.columns,
        values_f32le=base64.b64encode(raw).decode("ascii"),
        values_sha256=hashlib.sha256(raw).hexdigest(),
        rel_error=rel_error,
    )


def witness_values(witness: DecodeWitness) -> F32:
    """Return the witness rows as a binary32 array ``[len(rows), columns]``."""
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
    """Compare a consumer's decode of ``witness.rows`` with the witness (exact by default).

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
    weight: LogicalWeight,
    planes: Planes,
    witness: DecodeWitness | None = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> None:
    """Re-decode the witness rows with the reference decoder under ``weight``'s contract and compare."""
    chosen = witness if witness is not None else weight.witness
    if chosen is None:
        raise WitnessMismatchError(
            weight.name,
            "witness",
            "a decode witness",
            "none",
            "push records one per weight; re-push the artifact",
        )
    rows, columns = weight.shape.rows, weight.shape.columns
    if chosen.columns != columns or max(chosen.rows) >= rows:
        raise WitnessMismatchError(
            weight.name,
            "witness rows/columns",
            f"rows < {rows} and {columns} columns",
            f"rows up to {max(chosen.rows)} and {chosen.columns} columns",
            "the witness belongs to another weight",
        )
    decoded = decode_weight(weight, planes, chosen.rows)
    compare_witness(chosen, decoded, tensor=weight.name, atol=atol, rtol=rtol)
