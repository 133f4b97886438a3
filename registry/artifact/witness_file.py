"""A producer's own witness (``registry push … --witness FILE``): rows of its weights, checked by everyone.

Format (a safetensors file; names are logical weight names as ``registry inspect`` lists them)::

    <weight>.rows     I64 [R]       row indices (for [E, N, K] weights, of the flattened E·N rows), distinct
    <weight>.values   F32 [R, K]    the producer's values of those rows (K = 1 for vectors)

The values are the producer's weights at those rows: its dequantized values (then our decode must be
within half a quantization step of them — bit-equal for a producer that dequantizes as the contract's
decode law does, recorded as ``exact``), or the float weights it quantized with round-to-nearest.
Either way each element is held to the honest rounding bound of
:mod:`shardport.registry.contracts.rounding` — the same bound as ``--reference``. A producer that
moves codes off the nearest level (GPTQ's error feedback) supplies its dequantized values.

Push checks the file against our decode, stores a canonical copy (only these tensors, sorted) as a blob
the signed manifest names by digest (``producer_witness``); pull re-checks it on the bytes it wrote
(and keeps it as ``.shardport/witness.safetensors``), ``verify`` on the folder, and a rank load on the
rows and columns inside its slice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import Manifest, WitnessFileRef
from shardport.registry.contracts import LogicalWeight
from shardport.registry.contracts.errors import ReferenceErrorTooLargeError, WitnessMismatchError
from shardport.registry.contracts.rounding import check_against
from shardport.registry.errors import DigestMismatchError, UsageError
from shardport.registry.formats import BytesSource, parse_safetensors_source

I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]
PlanesOf = Callable[[LogicalWeight], Mapping[str, npt.NDArray[np.generic]]]
FOLDER_NAME = "witness.safetensors"
#: Largest witness file accepted (bytes).
MAX_BYTES = 1 << 30


class WitnessFileError(UsageError):  # type: ignore[misc, unused-ignore]
    """A ``--witness`` file that is not as documented; names the file, tensor, expected and found."""

    def __init__(self, source: str, tensor: str, field: str, expected: object, found: object) -> None:
        super().__init__(
            f"{source}: {tensor}: {field}: expected {expected}, found {found} — the witness file holds "
            "<weight>.rows (I64 [R]) and <weight>.values (F32 [R, K]) per weight; see the README"
        )


class WitnessWeightError(WitnessFileError):
    """A tensor names no weight of the checkpoint, or a weight lacks its rows or values."""


class WitnessShapeError(WitnessFileError):
    """A tensor has the wrong dtype or shape."""


class WitnessRowError(WitnessFileError):
    """A row index is out of range or repeated."""


class WitnessValueError(WitnessFileError):
    """A value is NaN or infinite."""


@dataclass(frozen=True)
class ProducerWitness:
    """Validated producer rows: per weight name, row indices ``[R]`` and values ``[R, K]``."""

    rows: Mapping[str, I64]
    values: Mapping[str, F32]

    def to_bytes(self) -> bytes:
        """The canonical file: these tensors only, contiguous, in sorted order."""
        from safetensors.numpy import save

        arrays: dict[str, npt.NDArray[np.generic]] = {}
        for name in sorted(self.rows):
            arrays[f"{name}.rows"] = np.ascontiguousarray(self.rows[name], dtype="<i8")
            arrays[f"{name}.values"] = np.ascontiguousarray(self.values[name], dtype="<f4")
        return bytes(save(arrays))


def _typed(
    raw: bytes, record_start: int, record_end: int, dtype: str, shape: tuple[int, ...]
) -> npt.NDArray[np.generic]:
    return np.frombuffer(
        raw, dtype=dtype, count=(record_end - record_start) // np.dtype(dtype).itemsize, offset=record_start
    ).reshape(shape)


def parse_witness(raw: bytes, weights: Sequence[LogicalWeight], source: str) -> ProducerWitness:
    """Parse and validate a witness file against the checkpoint's weights (typed errors, module doc)."""
    if len(raw) > MAX_BYTES:
        raise WitnessShapeError(source, "<file>", "size", f"at most {MAX_BYTES} bytes", len(raw))
    header = parse_safetensors_source(BytesSource(raw, source))
    by_name = {w.name: w for w in weights}
    found: dict[str, dict[str, tuple[str, tuple[int, ...], int, int]]] = {}
    for t in header.tensors:
        stem, _, part = t.name.rpartition(".")
        if part not in ("rows", "values") or stem not in by_name:
            raise WitnessWeightError(
                source,
                t.name,
                "tensor name",
                "<weight>.rows or <weight>.values of a weight of the checkpoint",
                "no such weight" if part in ("rows", "values") else f"suffix .{part}",
            )
        found.setdefault(stem, {})[part] = (t.dtype, t.shape, t.start, t.end)
    if not found:
        raise WitnessWeightError(source, "<file>", "tensors", "at least one weight's rows and values", "none")
    rows: dict[str, I64] = {}
    values: dict[str, F32] = {}
    for name, parts in sorted(found.items()):
        w = by_name[name]
        for part in ("rows", "values"):
            if part not in parts:
                raise WitnessWeightError(
                    source, f"{name}.{part}", "tensor", "present (rows and values go together)", "absent"
                )
        (rdt, rshape, r0, r1), (vdt, vshape, v0, v1) = parts["rows"], parts["values"]
        total, k = w.shape.rows, w.shape.columns
        if rdt != "I64" or len(rshape) != 1 or rshape[0] < 1:
            raise WitnessShapeError(
                source, f"{name}.rows", "dtype and shape", "I64 [R], R >= 1", f"{rdt} {list(rshape)}"
            )
        if vdt != "F32" or tuple(vshape) != (rshape[0], k):
            raise WitnessShapeError(
                source, f"{name}.values", "dtype and shape", f"F32 {[rshape[0], k]}", f"{vdt} {list(vshape)}"
            )
        index = _typed(raw, r0, r1, "<i8", tuple(rshape)).astype(np.int64)
        if index.min() < 0 or index.max() >= total:
            bad = int(index[(index < 0) | (index >= total)][0])
            raise WitnessRowError(source, f"{name}.rows", "row index", f"in [0, {total})", bad)
        if np.unique(index).size != index.size:
            raise WitnessRowError(source, f"{name}.rows", "row indices", "distinct", "a repeated row")
        vals = _typed(raw, v0, v1, "<f4", tuple(vshape)).astype(np.float32)
        if not np.isfinite(vals).all():
            r, c = (int(x) for x in np.argwhere(~np.isfinite(vals))[0])
            raise WitnessValueError(
                source, f"{name}.values", f"row {int(index[r])} column {c}", "a finite value", vals[r, c]
            )
        rows[name], values[name] = index, vals
    return ProducerWitness(rows=rows, values=values)


def read_witness_file(path: Path, weights: Sequence[LogicalWeight]) -> ProducerWitness:
    """Read ``--witness FILE`` and validate it against the weights."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise WitnessShapeError(str(path), "<file>", "size", f"at most {MAX_BYTES} bytes", size)
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--witness {path}: cannot read it ({exc.strerror or exc})") from exc
    return parse_witness(raw, weights, f"--witness {path}")


@contextlib.contextmanager
def stored_bytes() -> Iterator[None]:
    """Checking stored bytes against a signed producer witness: a disagreement means the bytes lied.

    At push the witness is input and a disagreement refuses it (:class:`ReferenceErrorTooLargeError`,
    exit 5); at pull, verify and rank load the witness is signed evidence, so the same finding is a
    verification failure (:class:`WitnessMismatchError`, exit 1).
    """
    try:
        yield
    except ReferenceErrorTooLargeError as exc:
        raise WitnessMismatchError(
            exc.tensor,
            f"producer witness: {exc.field}",
            exc.expected,
            exc.found,
            "the stored planes do not decode to what the signed producer witness says",
        ) from exc


def check_producer(
    witness: ProducerWitness, weights: Sequence[LogicalWeight], planes_of: PlanesOf, *, stored: bool = False
) -> bool:
    """Hold every witness row to our decode's rounding bound; True when every value is bit-equal.

    ``stored``: the planes are stored bytes checked against a signed witness (see :func:`stored_bytes`).
    """
    with stored_bytes() if stored else contextlib.nullcontext():
        return _check_producer(witness, weights, planes_of)


def _check_producer(witness: ProducerWitness, weights: Sequence[LogicalWeight], planes_of: PlanesOf) -> bool:
    exact = True
    for w in weights:
        if w.name not in witness.rows:
            continue
        rows = [int(r) for r in witness.rows[w.name]]
        _, _, same = check_against(w, planes_of(w), rows, witness.values[w.name], what="producer witness")
        exact = exact and same
    return exact


def check_producer_box(
    witness: ProducerWitness,
    weight: LogicalWeight,
    planes: Mapping[str, npt.NDArray[np.generic]],
    box: Mapping[str, tuple[int, int]],
) -> int:
    """A rank's check: the producer rows inside ``box`` (its E and N ranges), on its K range; the count."""
    if weight.name not in witness.rows:
        return 0
    index = witness.rows[weight.name]
    n = weight.shape.extents[-2] if len(weight.shape.extents) >= 2 else weight.shape.extents[0]
    e0, e1 = box.get("E", (0, 1))
    n0, n1 = box.get("N", (0, n))
    k0, k1 = box.get("K", (0, weight.shape.columns))
    expert, row = index // n, index % n
    inside = np.flatnonzero((expert >= e0) & (expert < e1) & (row >= n0) & (row < n1))
    if not inside.size or k0 >= k1:
        return 0
    rows = [int(index[i]) for i in inside]
    values = witness.values[weight.name][inside][:, k0:k1]
    with stored_bytes():  # a rank checks stored bytes against signed evidence
        check_against(weight, planes, rows, values, what="producer witness", columns=(k0, k1))
    return len(rows)


def load_producer(
    manifest: Manifest, read: Callable[[str], bytes], *, source: str = "producer witness"
) -> ProducerWitness | None:
    """The manifest's producer witness, its bytes checked against the signed digest and size."""
    ref = manifest.producer_witness
    if ref is None:
        return None
    raw = read(ref.digest)
    if digest_bytes(raw) != ref.digest or len(raw) != ref.size:
        raise DigestMismatchError(
            f"{source}: expected {ref.size} bytes hashing to {ref.digest}, found {len(raw)} bytes hashing "
            f"to {digest_bytes(raw)}"
        )
    return parse_witness(raw, manifest.weights or [], f"{source} {ref.digest}")


def producer_blob(
    path: Path, weights: Sequence[LogicalWeight], planes_of: PlanesOf
) -> tuple[bytes, WitnessFileRef]:
    """Push: read ``--witness FILE``, check it against our decode, and return its canonical blob and ref."""
    witness = read_witness_file(path, weights)
    exact = check_producer(witness, weights, planes_of)
    blob = witness.to_bytes()
    return blob, WitnessFileRef(
        digest=digest_bytes(blob),
        size=len(blob),
        weights=len(witness.rows),
        rows=sum(len(r) for r in witness.rows.values()),
        exact=exact,
    )
