"""The parity ladder, levels 0-3, as plain data: proof that a kernel's bytes mean what the manifest says.

- L0 bytes and inventory: the planes came from verified tiles of the pinned manifest (the caller passes
  the manifest digest and the loader's verified-tile count; recorded here with every plane's bytes).
- L1 code preservation: the codes read back out of the kernel's layout equal the codes of the planes,
  exactly; a change of representation that is not a permutation (scale cast, rounding law) is labelled a
  ``conversion`` with its largest reconstruction error. The record says how the codes were read back
  (by the kernel, or through a byte map learnt from the packer, which a full ladder holds to the
  kernel's read-back). A layout that keeps the stored planes (the direct kernels) is read back by its
  own matmul on one-hot activations over :func:`spot_columns`: codes where a unit-scale call gives them
  (``cpu.int4-direct``), else the binary32 values against the reference decode (``cpu.gguf-direct``),
  exactly either way. Where nothing can be read back (the reference decoder itself, a dense float copy)
  the level is ``not applicable`` with the reason, never a pass over 0 codes.
- L2 reconstruction: the layout's decode equals the registry's reference decode of the slice exactly,
  or, for a conversion, within its budget element by element (:mod:`.budget`: the rounding of the
  format the layout holds the weight's terms in, computed from the planes -- never the measured
  error); and the manifest's witness cells inside the rank's slice re-digest to the recorded values.
- L3 operator: for golden activations ``X``, ``E_kernel = ‖Y_kernel - Y_ref‖/‖Y_ref‖`` against the
  kernel's accumulation tolerance plus, for a conversion, ``‖|X|·B^T‖/‖Y_ref‖`` (the most the L2 budget
  ``B`` lets the product move) and, where a float weight exists, ``E_quant = ‖Y_ref - Y_fp‖/‖Y_fp‖``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shardport.registry.contracts.decode import decode_weight
from shardport.registry.contracts.model import CELL_DIGEST_BYTES, CellWitness, DecodeWitness, cell_positions

from .budget import Budget
from .errors import ParityError
from .parity_codes import SPOT_PERIOD as SPOT_PERIOD
from .parity_codes import L1Codes as L1Codes
from .parity_codes import _Frozen, _level1, level1_by_map, where_of
from .parity_codes import level1 as level1
from .parity_codes import spot_columns as spot_columns
from .prepared import PreparedLinear
from .weight import RankWeight

F32 = npt.NDArray[np.float32]

#: E_kernel tolerance (relative Frobenius) per kernel id and activation dtype: the accumulation error of
#: the kernel's dtype over K, not the quantization error (that is E_quant's).
KERNEL_TOLERANCE: dict[str, dict[str, float]] = {
    "cpu.int4pack": {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3},
    "cpu.int8pack": {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3},
    "cpu.gguf-direct": {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3},
    "cpu.int4-direct": {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3},
    "cuda.int4-tinygemm": {"bfloat16": 2e-2},
    "full-dequant": {"float32": 1e-6, "bfloat16": 2e-2, "float16": 4e-3},
    "reference": {"float32": 1e-6, "bfloat16": 1e-2, "float16": 2e-3},
}


class PlaneRecord(_Frozen):
    """One plane the kernel consumed: role, tensor, numpy dtype, rank-local shape, bytes."""

    role: str
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class L0Bytes(_Frozen):
    """Bytes and inventory: the manifest and the verified tiles the planes came from."""

    manifest_digest: str
    verified_tiles: int
    planes: tuple[PlaneRecord, ...]
    passed: bool


class L2Decode(_Frozen):
    """Reconstruction: layout decode vs reference decode, and the witness cells inside the slice.

    ``reconstruction``: False where only the witness comparison ran (a sampled ladder: the layout's
    full decode was compared on the class's representative, see :class:`Ladder`); ``exact`` and
    ``max_abs_error`` then say nothing (False and 0.0). ``tolerance``: the largest element of the
    conversion budget (0.0: exact required); each element is held to its own bound, and
    ``error_over_budget`` is the largest ``|Δ|/bound`` (<= 1 passes); ``first_violation`` the first
    element outside. ``tolerance_source``: where the budget comes from (never the measured error).
    """

    reconstruction: bool = True
    exact: bool
    max_abs_error: float
    tolerance: float
    tolerance_source: str = ""
    error_over_budget: float | None = None
    first_violation: str | None = None
    witness_kind: str | None
    witness_checked: int
    witness_passed: bool
    passed: bool


class L3Operator(_Frozen):
    """Operator error at one activation batch: kernel vs reference, reference vs float.

    ``e_conversion``: ``‖X·(W_layout - W_ref)^T‖/‖Y_ref‖`` in float64, the part of ``e_kernel`` the
    layout's conversion accounts for (0 for an exact layout); measured, recorded, never a tolerance.
    ``tol_conversion``: ``‖|X|·B^T‖/‖Y_ref‖`` for the L2 budget ``B`` (0 for an exact layout): the most a
    layout within its budget can move the product. ``e_kernel`` passes at ``tol_kernel +
    tol_conversion``; ``tolerance_source`` says so.
    """

    tokens: int
    activation_dtype: str
    e_kernel: float
    tol_kernel: float
    e_conversion: float
    tol_conversion: float = 0.0
    tolerance_source: str = ""
    e_quant: float | None
    tol_quant: float | None
    passed: bool


class Ladder(_Frozen):
    """L0-L3 of one rank's weight under one prepared kernel.

    ``scope``: ``full`` (every level on this weight) or ``sampled`` (L0, L1 and the L2 witness
    comparison on this weight; the L2 reconstruction and L3 ran on ``represented_by``, the first weight
    of the same ``ladder_class`` on the rank, so this weight is proved only together with that one's
    ladder). ``ladder_class``: the class key the budget grouped operators by (None: no budget applied).
    """

    weight: str
    kernel: str
    transformation: str
    l0: L0Bytes
    l1: L1Codes
    l2: L2Decode
    l3: tuple[L3Operator, ...]
    scope: Literal["full", "sampled"] = "full"
    ladder_class: str | None = None
    represented_by: str | None = None

    @property
    def passed(self) -> bool:
        """Every level run on this weight passed (a sampled one also needs its representative's)."""
        return self.l0.passed and self.l1.passed and self.l2.passed and all(x.passed for x in self.l3)


def level0(weight: RankWeight, manifest_digest: str, verified_tiles: int) -> L0Bytes:
    """Record the manifest digest, the loader's verified-tile count and every plane's bytes."""
    planes = tuple(
        PlaneRecord(
            role=role,
            tensor=weight.names[role],
            dtype=str(array.dtype),
            shape=tuple(int(d) for d in array.shape),
            nbytes=int(array.nbytes),
        )
        for role, array in sorted(weight.planes.items())
    )
    passed = verified_tiles > 0 and bool(manifest_digest) and all(p.nbytes > 0 for p in planes)
    return L0Bytes(
        manifest_digest=manifest_digest, verified_tiles=verified_tiles, planes=planes, passed=passed
    )


def _cell_digest(values: F32) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<f4").tobytes()).digest()[:CELL_DIGEST_BYTES]


def witness_rows(weight: RankWeight) -> list[int]:
    """The slice's local rows the manifest's witness covers (cells or rows inside the slice), sorted."""
    witness = weight.weight.witness
    n0, k0 = weight.row_start, weight.col_start
    n1, k1 = n0 + weight.n_local, k0 + weight.k_local
    if isinstance(witness, CellWitness):
        rows = {r for r, c0, c1 in cell_positions(witness) if n0 <= r < n1 and k0 <= c0 and c1 <= k1}
    elif isinstance(witness, DecodeWitness):
        rows = {r for r in witness.rows if n0 <= r < n1}
    else:
        rows = set()
    return sorted(r - n0 for r in rows)


def _witness(weight: RankWeight, decoded: F32, rows: list[int] | None = None) -> tuple[str | None, int, bool]:
    """Compare the witness cells (rows) inside the slice with ``decoded``; (kind, checked, all equal).

    ``decoded``: the slice's reference decode, all of it, or only its local ``rows`` (in that order).
    """
    at = {r: i for i, r in enumerate(rows)} if rows is not None else None

    def row(local: int) -> F32:
        out: F32 = decoded[local] if at is None else decoded[at[local]]
        return out

    witness = weight.weight.witness
    n0, k0 = weight.row_start, weight.col_start
    n1, k1 = n0 + weight.n_local, k0 + weight.k_local
    if isinstance(witness, CellWitness):
        raw = base64.b64decode(witness.digests, validate=True)
        checked, ok = 0, True
        for i, (r, c0, c1) in enumerate(cell_positions(witness)):
            if n0 <= r < n1 and k0 <= c0 and c1 <= k1:
                stored = raw[i * CELL_DIGEST_BYTES : (i + 1) * CELL_DIGEST_BYTES]
                ok &= _cell_digest(row(r - n0)[c0 - k0 : c1 - k0]) == stored
                checked += 1
        return "cells", checked, ok
    if isinstance(witness, DecodeWitness):
        raw = base64.b64decode(witness.values_f32le, validate=True)
        values = np.frombuffer(raw, dtype="<f4").reshape(len(witness.rows), witness.columns)
        checked, ok = 0, True
        for i, r in enumerate(witness.rows):
            if n0 <= r < n1:
                ok &= bool(np.array_equal(values[i, k0:k1], row(r - n0)))
                checked += 1
        return "rows", checked, ok
    return None, 0, True


#: The L2 tolerance source of a layout held to the reference decode exactly.
EXACT_SOURCE = "exact: the layout keeps or permutes the stored codes and scales (budget 0)"


def budget_for(
    prepared: PreparedLinear, weight: RankWeight, reference: F32, layout: F32
) -> tuple[Budget | None, str]:
    """The conversion budget a layout is held to, and its source; (None, source): exact required.

    A layout equal to the reference needs none; a ``none``/``repack`` layout gets none (it only
    permutes); a conversion or full dequant gets its kernel's :meth:`~.prepared.PreparedLinear.
    conversion_budget` (a conversion without one is held to exact, and the source says so).
    """
    if prepared.transformation in ("none", "repack") or np.array_equal(layout, reference):
        return None, EXACT_SOURCE
    budget = prepared.conversion_budget(weight, reference)
    if budget is None:
        what = prepared.transformation
        return None, f"exact: {prepared.kernel} declares no conversion budget for its {what}"
    return budget, budget.source


def _violations(
    weight: RankWeight, error: npt.NDArray[np.float64], budget: Budget
) -> tuple[float, str | None, bool]:
    """(largest ``|Δ|/bound``, the first element outside its bound, all inside)."""
    bound = budget.bound
    inside = error <= bound  # NaN is outside
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / bound)
    worst = float(np.max(ratio)) if ratio.size else 0.0
    if bool(inside.all()):
        return worst, None, True
    r, k, at = where_of(weight, ~inside)
    first = f"{at}: |Δ| {float(error[r, k]):.6g} > bound {float(bound[r, k]):.6g}"
    return float("nan") if np.isnan(error).any() else worst, first, False


def level2(
    prepared: PreparedLinear,
    weight: RankWeight,
    *,
    reference: F32 | None = None,
    layout: F32 | None = None,
    budget: tuple[Budget | None, str] | None = None,
) -> L2Decode:
    """Layout decode vs the reference decode of the slice, and the reference vs the witness in the slice.

    ``exact``: equal as numbers element by element (``-0.0`` equals ``+0.0``: a layout that adds a zero
    of ``+0.0`` turns ``d·0`` with a negative ``d`` into ``+0.0``, which no matmul can tell apart);
    otherwise each element is held to the conversion budget (:func:`budget_for`; ``budget``: already
    made by the caller), never to the measured conversion error. The witness cells (rows) inside the
    slice are re-digested from the reference decode of the rank's own planes, so together the two
    comparisons tie the layout to the manifest.
    """
    reference = decode_weight(weight.local_weight, weight.named_planes) if reference is None else reference
    mine = prepared.decode() if layout is None else layout
    exact = bool(np.array_equal(mine, reference))
    held, source = budget_for(prepared, weight, reference, mine) if budget is None else budget
    error = 0.0  # equal element by element: no difference to measure
    ratio: float | None = None
    first = None
    within = exact
    if not exact and reference.size:
        diff = np.abs(mine.astype(np.float64) - reference.astype(np.float64))
        error = float(diff.max())
        if held is not None:
            ratio, first, within = _violations(weight, diff, held)
        else:
            r, k, at = where_of(weight, ~(diff == 0))
            first = f"{at}: |Δ| {float(diff[r, k]):.6g} > 0 (exact required)"
    kind, checked, witness_ok = _witness(weight, reference)
    return L2Decode(
        exact=exact,
        max_abs_error=error,
        tolerance=float(held.bound.max()) if held is not None and held.bound.size else 0.0,
        tolerance_source=source,
        error_over_budget=ratio,
        first_violation=first,
        witness_kind=kind,
        witness_checked=checked,
        witness_passed=witness_ok,
        passed=witness_ok and within,
    )


def _relative(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    norm = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / norm if norm > 0 else float(np.linalg.norm(a - b))


def _tolerance_l3(x64: npt.NDArray[np.float64], y_ref: npt.NDArray[np.float64], held: Budget | None) -> float:
    """``‖|X|·B^T‖/‖Y_ref‖``: the most a layout within budget ``B`` moves the product (0 without one)."""
    if held is None:
        return 0.0
    return _relative(np.abs(x64) @ held.bound.T + y_ref, y_ref)


def level3(
    prepared: PreparedLinear,
    weight: RankWeight,
    x: F32,
    *,
    float_weight: F32 | None = None,
    tol_quant: float | None = None,
    reference: F32 | None = None,
    layout: F32 | None = None,
    reference64: npt.NDArray[np.float64] | None = None,
    budget: tuple[Budget | None, str] | None = None,
) -> L3Operator:
    """Run the kernel on golden activations ``x [T, k_local]`` (binary32; cast to the op's dtype).

    ``float_weight``: the unquantized weight's slice ``[n_local, k_local]`` where one exists, with
    ``tol_quant`` the quantization error the contract's bit width allows. ``reference64``: the
    reference decode already widened to float64 (a ladder widens it once for all its batches).
    ``budget``: the layout's conversion budget (:func:`budget_for`), made here when not given.
    """
    import torch

    dtype = prepared.op.activation_dtype
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(getattr(torch, dtype))
    x64 = xt.double().numpy()  # the activations the kernel actually saw
    got = prepared(xt).double().numpy()
    if reference is None and (reference64 is None or budget is None):
        reference = decode_weight(weight.local_weight, weight.named_planes)
    if reference64 is None:
        assert reference is not None
        reference64 = reference.astype(np.float64)
    y_ref = x64 @ reference64.T
    e_kernel = _relative(got, y_ref)
    tol_kernel = KERNEL_TOLERANCE.get(prepared.kernel.split("@")[0], {}).get(dtype, 0.0)
    e_conversion = 0.0
    if budget is None and prepared.transformation in ("none", "repack"):
        budget = (None, EXACT_SOURCE)  # held to exact: no decode of the layout needed here
    mine = None
    if budget is None or budget[0] is not None:
        mine = prepared.decode() if layout is None else layout
    if budget is None:
        assert reference is not None and mine is not None
        budget = budget_for(prepared, weight, reference, mine)
    held, source = budget
    if held is not None and mine is not None:  # a layout that differs from the reference
        e_conversion = _relative(x64 @ mine.astype(np.float64).T, y_ref)
    tol_conversion = _tolerance_l3(x64, y_ref, held)
    e_quant = None
    if float_weight is not None:
        e_quant = _relative(y_ref, x64 @ np.asarray(float_weight, dtype=np.float64).T)
    passed = e_kernel <= tol_kernel + tol_conversion and (
        e_quant is None or tol_quant is None or e_quant <= tol_quant
    )
    return L3Operator(
        tokens=int(x.shape[0]),
        activation_dtype=dtype,
        e_kernel=e_kernel,
        tol_kernel=tol_kernel,
        e_conversion=e_conversion,
        tol_conversion=tol_conversion,
        tolerance_source=f"KERNEL_TOLERANCE[{prepared.kernel.split('@')[0]}][{dtype}]"
        + ("" if held is None else f" + ‖|X|·B^T‖/‖Y_ref‖, B: {source}"),
        e_quant=e_quant,
        tol_quant=tol_quant,
        passed=passed,
    )


def ladder(
    prepared: PreparedLinear,
    weight: RankWeight,
    *,
    manifest_digest: str,
    verified_tiles: int,
    activations: tuple[F32, ...],
    float_weight: F32 | None = None,
    tol_quant: float | None = None,
    ladder_class: str | None = None,
) -> Ladder:
    """Run L0-L3 (L3 once per activation batch, e.g. decode T=1 and prefill T=64).

    The reference decode (widened to float64 once), the layout's decode and its conversion budget are
    made once and shared by L1-L3; a layout that reads its codes back through the kernel reads them once
    for L1 and L2 (:meth:`~.prepared.PreparedLinear.read_back`).
    """
    reference = decode_weight(weight.local_weight, weight.named_planes)
    layout, pair = prepared.read_back(weight)
    mapped = prepared.map_codes() if pair is not None else None  # proved against the kernel's read-back
    reference64 = reference.astype(np.float64)
    budget = budget_for(prepared, weight, reference, layout)
    return Ladder(
        weight=weight.where,
        kernel=prepared.kernel,
        transformation=prepared.transformation,
        l0=level0(weight, manifest_digest, verified_tiles),
        l1=_level1(prepared, weight, pair, mapped=mapped, reference=reference),
        l2=level2(prepared, weight, reference=reference, layout=layout, budget=budget),
        l3=tuple(
            level3(
                prepared,
                weight,
                x,
                float_weight=float_weight,
                tol_quant=tol_quant,
                reference=reference,
                layout=layout,
                reference64=reference64,
                budget=budget,
            )
            for x in activations
        ),
        ladder_class=ladder_class,
    )


def ladder_sampled(
    prepared: PreparedLinear,
    weight: RankWeight,
    *,
    manifest_digest: str,
    verified_tiles: int,
    represented_by: str,
    ladder_class: str | None = None,
) -> Ladder:
    """The sampled ladder of a weight whose class representative ran the full one (``represented_by``).

    L0 in full; L1 in full (every code read back against the planes' codes: through the layout's byte
    map where it has one, :func:`level1_by_map`, else through the kernel; a direct kernel's
    :func:`spot_columns`); L2 the witness comparison only, on the reference decode of just the
    witnessed rows of the slice; no L3.
    """
    rows = witness_rows(weight)
    decoded = (
        decode_weight(weight.local_weight, weight.named_planes, rows)
        if rows
        else np.zeros((0, weight.k_local), dtype=np.float32)
    )
    kind, checked, witness_ok = _witness(weight, decoded, rows)
    l2 = L2Decode(
        reconstruction=False,
        exact=False,
        max_abs_error=0.0,
        tolerance=0.0,
        tolerance_source=f"witness rows only here (the reconstruction ran on {represented_by})",
        witness_kind=kind,
        witness_checked=checked,
        witness_passed=witness_ok,
        passed=witness_ok,
    )
    return Ladder(
        weight=weight.where,
        kernel=prepared.kernel,
        transformation=prepared.transformation,
        l0=level0(weight, manifest_digest, verified_tiles),
        l1=level1_by_map(prepared, weight),
        l2=l2,
        l3=(),
        scope="sampled",
        ladder_class=ladder_class,
        represented_by=represented_by,
    )


def require(result: Ladder) -> Ladder:
    """Return ``result`` if every level passed; else raise :class:`ParityError` naming the first failure."""
    if result.passed:
        return result
    failed: list[tuple[str, Any]] = [
        ("L0", result.l0),
        ("L1", result.l1),
        ("L2", result.l2),
        *((f"L3 T={x.tokens}", x) for x in result.l3),
    ]
    level, record = next((name, r) for name, r in failed if not r.passed)
    raise ParityError(
        result.weight, f"parity {level} under {result.kernel}", "passed", record.model_dump_json()
    )
