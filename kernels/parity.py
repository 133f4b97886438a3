"""The parity ladder, levels 0-3, as plain data: proof that a kernel's bytes mean what the manifest says.

- L0 bytes and inventory: the planes came from verified tiles of the pinned manifest (the caller passes
  the manifest digest and the loader's verified-tile count; recorded here with every plane's bytes).
- L1 code preservation: the codes read back out of the kernel's layout equal the codes of the planes,
  exactly; a change of representation that is not a permutation (scale cast, rounding law) is labelled a
  ``conversion`` with its largest reconstruction error. The record says how the codes were read back
  (by the kernel, or through a byte map learnt from the packer, which a full ladder holds to the
  kernel's read-back).
- L2 reconstruction: the layout's decode equals the registry's reference decode of the slice (exactly,
  or within the recorded conversion error), and the manifest's witness cells inside the rank's slice
  re-digest to the recorded values.
- L3 operator: for golden activations ``X``, ``E_kernel = ‖Y_kernel - Y_ref‖/‖Y_ref‖`` and, where a
  float weight exists, ``E_quant = ‖Y_ref - Y_fp‖/‖Y_fp‖``, each against its tolerance.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from shardport.registry.contracts.decode import decode_weight
from shardport.registry.contracts.model import CELL_DIGEST_BYTES, CellWitness, DecodeWitness, cell_positions

from .errors import ParityError
from .prepared import Codes, PreparedLinear
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


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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


class L1Codes(_Frozen):
    """Code preservation: codes read back from the layout vs the planes' codes.

    ``readback``: how the codes were read back out of the layout -- ``kernel`` (by the kernel itself,
    or the operand it consumes), ``byte-map`` (through the byte map learnt from the packer, see
    :mod:`.int4_bytemap`), ``byte-map+kernel`` (a sampled ladder: through the byte map, the kernel's
    read-back of :func:`spot_columns` in place of the map's there), ``kernel+byte-map`` (by the kernel,
    and the byte map's read-back compared with it). ``map_mismatches``: codes where the map and the
    kernel disagree, which fails the level.
    """

    applicable: bool
    codes_compared: int
    mismatches: int
    first_mismatch: str | None
    representation: str
    max_reconstruction_error: float
    passed: bool
    readback: Literal["kernel", "byte-map", "kernel+byte-map", "byte-map+kernel"] = "kernel"
    map_mismatches: int | None = None


class L2Decode(_Frozen):
    """Reconstruction: layout decode vs reference decode, and the witness cells inside the slice.

    ``reconstruction``: False where only the witness comparison ran (a sampled ladder: the layout's
    full decode was compared on the class's representative, see :class:`Ladder`); ``exact`` and
    ``max_abs_error`` then say nothing (False and 0.0).
    """

    reconstruction: bool = True
    exact: bool
    max_abs_error: float
    tolerance: float
    witness_kind: str | None
    witness_checked: int
    witness_passed: bool
    passed: bool


class L3Operator(_Frozen):
    """Operator error at one activation batch: kernel vs reference, reference vs float.

    ``e_conversion``: ``‖X·(W_layout - W_ref)^T‖/‖Y_ref‖`` in float64, the part of ``e_kernel`` a recorded
    conversion accounts for (0 for an exact repack); ``e_kernel`` passes at ``tol_kernel + e_conversion``.
    """

    tokens: int
    activation_dtype: str
    e_kernel: float
    tol_kernel: float
    e_conversion: float
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


def level1_by_map(prepared: PreparedLinear, weight: RankWeight) -> L1Codes:
    """L1 with the codes read back through the layout's byte map where it has one (else the kernel).

    Exact like :func:`level1` (every code, compared as uint8), at the cost of a gather instead of a
    matmul per pair of columns. The map is learnt from the packer, which then packed these bytes, so
    on its own the comparison would only show the map agrees with itself; the kernel therefore also
    reads back :func:`spot_columns` (every K residue of a tile, every row, so every block) and its codes
    replace the map's there: a map wrong anywhere the spot columns reach fails the level against the
    planes, and ``map_mismatches`` counts where map and kernel disagree (readback ``byte-map+kernel``).
    The full ladder of the class's representative compares the two on every code.
    """
    pair = prepared.map_check(weight)
    if pair is None:
        return level1(prepared, weight)
    expected, mapped = pair
    columns = spot_columns(weight.k_local)
    kernel = prepared.kernel_columns(columns)
    if kernel is None:
        return _level1(prepared, weight, pair, readback="byte-map")
    found = mapped.astype(np.int16)
    found[:, columns] = kernel
    result = _level1(prepared, weight, (expected, found), mapped=mapped)
    return result.model_copy(update={"readback": "byte-map+kernel"})


def _where(weight: RankWeight, differ: npt.NDArray[np.bool_]) -> tuple[int, int, str]:
    r, k = (int(i) for i in np.argwhere(differ)[0])
    return r, k, f"row {weight.row_start + r} column {weight.col_start + k}"


def _level1(
    prepared: PreparedLinear,
    weight: RankWeight,
    pair: tuple[Codes, Codes] | None,
    *,
    readback: Literal["kernel", "byte-map"] = "kernel",
    mapped: Codes | None = None,
) -> L1Codes:
    """``pair``: (planes' codes, read-back codes); ``mapped``: the byte map's read-back to hold to it."""
    representation = prepared.transformation
    if pair is None:
        return L1Codes(
            applicable=False,
            codes_compared=0,
            mismatches=0,
            first_mismatch=None,
            representation=representation,
            max_reconstruction_error=prepared.conversion_error,
            passed=True,
        )
    expected, found = pair
    shaped = expected.shape == found.shape
    differ = expected != found if shaped else np.zeros((0, 0), dtype=np.bool_)
    mismatches = int(np.count_nonzero(differ))
    first = None
    if mismatches:
        r, k, at = _where(weight, differ)
        first = f"{at}: {expected[r, k]} -> {found[r, k]}"
    map_mismatches = None
    if mapped is not None:
        disagree = mapped != found if mapped.shape == found.shape else np.ones((1, 1), dtype=np.bool_)
        map_mismatches = int(np.count_nonzero(disagree))
        if map_mismatches and first is None:
            r, k, at = _where(weight, disagree) if disagree.shape == found.shape else (0, 0, "shape")
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


def level2(
    prepared: PreparedLinear, weight: RankWeight, *, reference: F32 | None = None, layout: F32 | None = None
) -> L2Decode:
    """Layout decode vs the reference decode of the slice, and the reference vs the witness in the slice.

    ``exact``: equal as numbers element by element (``-0.0`` equals ``+0.0``: a layout that adds a zero
    of ``+0.0`` turns ``d·0`` with a negative ``d`` into ``+0.0``, which no matmul can tell apart);
    otherwise the layout is held to the recorded conversion error. The witness cells (rows) inside the
    slice are re-digested from the reference decode of the rank's own planes, so together the two
    comparisons tie the layout to the manifest.
    """
    reference = decode_weight(weight.local_weight, weight.named_planes) if reference is None else reference
    mine = prepared.decode() if layout is None else layout
    exact = bool(np.array_equal(mine, reference))
    error = 0.0  # equal element by element: no difference to measure
    if not exact and reference.size:
        error = float(np.abs(mine.astype(np.float64) - reference.astype(np.float64)).max())
    kind, checked, witness_ok = _witness(weight, reference)
    return L2Decode(
        exact=exact,
        max_abs_error=error,
        tolerance=prepared.conversion_error,
        witness_kind=kind,
        witness_checked=checked,
        witness_passed=witness_ok,
        passed=witness_ok and (exact or error <= prepared.conversion_error),
    )


def _relative(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    norm = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / norm if norm > 0 else float(np.linalg.norm(a - b))


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
) -> L3Operator:
    """Run the kernel on golden activations ``x [T, k_local]`` (binary32; cast to the op's dtype).

    ``float_weight``: the unquantized weight's slice ``[n_local, k_local]`` where one exists, with
    ``tol_quant`` the quantization error the contract's bit width allows. ``reference64``: the
    reference decode already widened to float64 (a ladder widens it once for all its batches).
    """
    import torch

    dtype = prepared.op.activation_dtype
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(getattr(torch, dtype))
    x64 = xt.double().numpy()  # the activations the kernel actually saw
    got = prepared(xt).double().numpy()
    if reference64 is None:
        if reference is None:
            reference = decode_weight(weight.local_weight, weight.named_planes)
        reference64 = reference.astype(np.float64)
    y_ref = x64 @ reference64.T
    e_kernel = _relative(got, y_ref)
    tol_kernel = KERNEL_TOLERANCE.get(prepared.kernel.split("@")[0], {}).get(dtype, 0.0)
    e_conversion = 0.0
    if prepared.transformation != "repack" and prepared.conversion_error > 0:
        mine = prepared.decode() if layout is None else layout
        e_conversion = _relative(x64 @ mine.astype(np.float64).T, y_ref)
    e_quant = None
    if float_weight is not None:
        e_quant = _relative(y_ref, x64 @ np.asarray(float_weight, dtype=np.float64).T)
    passed = e_kernel <= tol_kernel + e_conversion and (
        e_quant is None or tol_quant is None or e_quant <= tol_quant
    )
    return L3Operator(
        tokens=int(x.shape[0]),
        activation_dtype=dtype,
        e_kernel=e_kernel,
        tol_kernel=tol_kernel,
        e_conversion=e_conversion,
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

    The reference decode (widened to float64 once) and the layout's decode are made once and shared
    by L2 and L3; a layout that reads its codes back through the kernel reads them once for L1 and L2
    (:meth:`~.prepared.PreparedLinear.read_back`).
    """
    reference = decode_weight(weight.local_weight, weight.named_planes)
    layout, pair = prepared.read_back(weight)
    mapped = prepared.map_codes() if pair is not None else None  # proved against the kernel's read-back
    reference64 = reference.astype(np.float64)
    return Ladder(
        weight=weight.where,
        kernel=prepared.kernel,
        transformation=prepared.transformation,
        l0=level0(weight, manifest_digest, verified_tiles),
        l1=_level1(prepared, weight, pair, mapped=mapped),
        l2=level2(prepared, weight, reference=reference, layout=layout),
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
    map where it has one, :func:`level1_by_map`, else through the kernel); L2 the witness comparison
    only, on the reference decode of just the witnessed rows of the slice; no L3.
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
        tolerance=prepared.conversion_error,
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
