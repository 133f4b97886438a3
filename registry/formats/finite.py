"""Finite float tensors: no NaN and no ±inf in any stored float weight, read in bounded chunks.

A NaN in a norm or an embedding passes every structural gate, loads, and turns the logits into NaN:
the checkpoint is refused at push (:class:`~.errors.NonFiniteValueError`, exit 5), naming the file,
the tensor and the flat (row-major) index of the first non-finite element, with the counts of the
rest. ``push --allow-nonfinite`` records it as a note instead (a checkpoint that really stores them);
a float plane of a quantized weight (scales, float zero points) is refused whatever the switch says.

Which tensors: every element type the reference decoder widens from a float format
(:data:`~.elements.ELEMENTS`' ``float_format``): F64, F32, F16, BF16, F8_E5M2, F8_E4M3 (whose only
non-finite pattern is NaN), F8_E8M0 (0xFF is NaN) — safetensors dtypes and the GGUF float types of
the same names. GGUF quant blocks are not element types: their binary16 block scales are the
semantic gates' (:func:`shardport.registry.contracts.gates.check_values`).

How: the tensor's byte range is read with ``readinto`` into one reused buffer of :data:`CHUNK_BYTES`
(never the whole file in memory); each chunk is viewed as unsigned integers and its exponent field
compared with the all-ones pattern (IEEE NaN and inf), so every format takes the same two numpy
passes per chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from io import BufferedIOBase
from pathlib import Path

import numpy as np

from .elements import ELEMENTS
from .errors import NonFiniteValueError

CHUNK_BYTES = 4 << 20
"""Bytes read per step (a multiple of every element size)."""


@dataclass(frozen=True, slots=True)
class _Pattern:
    """Where a float format keeps its exponent; ``mantissa`` None: the all-ones pattern is only NaN."""

    view: str
    exponent: int
    mantissa: int | None
    magnitude: int
    """Every bit but the sign: a value is non-finite exactly when ``bits & magnitude >= exponent``."""
    native: str | None = None
    """A numpy float view whose ``isfinite`` is the faster test (binary32, binary64)."""


#: float format → the raw-bits view and the fields that make a value non-finite.
_PATTERNS: dict[str, _Pattern] = {
    "binary64": _Pattern("<u8", 0x7FF0_0000_0000_0000, 0x000F_FFFF_FFFF_FFFF, (1 << 63) - 1, "<f8"),
    "binary32": _Pattern("<u4", 0x7F80_0000, 0x007F_FFFF, 0x7FFF_FFFF, "<f4"),
    "binary16": _Pattern("<u2", 0x7C00, 0x03FF, 0x7FFF),
    "bfloat16": _Pattern("<u2", 0x7F80, 0x007F, 0x7FFF),
    "e5m2": _Pattern("u1", 0x7C, 0x03, 0x7F),
    "e4m3": _Pattern("u1", 0x7F, None, 0x7F),  # the fn variant: S.1111.111 is NaN, no inf
    "e8m0": _Pattern("u1", 0xFF, None, 0xFF),  # unsigned: 0xFF is NaN
}


def float_dtype(dtype: str) -> bool:
    """Whether tensors of element type ``dtype`` are checked (a float format with NaN or inf)."""
    e = ELEMENTS.get(dtype)
    return e is not None and e.block == 1 and e.float_format in _PATTERNS


@dataclass(frozen=True, slots=True)
class NonFinite:
    """What one tensor holds that is not finite: the first element (flat index, kind) and the counts."""

    index: int
    kind: str
    """``NaN``, ``+inf`` or ``-inf``."""
    nan: int
    inf: int
    elements: int

    def describe(self) -> str:
        """``NaN at flat index 17 (2 NaN, 1 inf of 192 elements)``."""
        return (
            f"{self.kind} at flat index {self.index} "
            f"({self.nan} NaN, {self.inf} inf of {self.elements} elements)"
        )


@dataclass(frozen=True, slots=True)
class StoredFloat:
    """One stored tensor to check: its file (relative to the root), name, byte range and element type."""

    file: str
    name: str
    start: int
    end: int
    dtype: str


def _read(handle: BufferedIOBase, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = handle.readinto(into[got:])
        if not n:
            raise OSError(f"unexpected end of file after {got} of {len(into)} bytes")
        got += n


def scan(
    handle: BufferedIOBase, start: int, end: int, dtype: str, chunk_bytes: int = CHUNK_BYTES
) -> NonFinite | None:
    """The non-finite elements of the ``dtype`` tensor at bytes ``[start, end)`` of ``handle``, or None."""
    element = ELEMENTS[dtype]
    pattern = _PATTERNS[str(element.float_format)]
    size = int(element.itemsize or 1)
    step = max(size, chunk_bytes - chunk_bytes % size)
    buffer = np.empty(min(step, max(end - start, 0)), dtype=np.uint8)
    view = memoryview(buffer)  # type: ignore[arg-type, unused-ignore]
    first: tuple[int, str] | None = None
    nan = inf = 0
    exponent = np.array(pattern.exponent, dtype=pattern.view)
    magnitude = np.array(pattern.magnitude, dtype=pattern.view)
    scratch = np.empty(len(buffer) // size, dtype=pattern.view)
    handle.seek(start)
    for offset in range(start, end, step):
        length = min(step, end - offset)
        _read(handle, view[:length])
        bits = buffer[:length].view(pattern.view)
        if pattern.native is not None:  # one pass each; no boolean array beyond isfinite's
            if np.isfinite(bits.view(pattern.native)).all():
                continue
        elif np.bitwise_and(bits, magnitude, out=scratch[: len(bits)]).max() < exponent:
            continue
        where = np.flatnonzero((bits & exponent) == exponent)
        values = bits[where]
        infinite = (
            (values & np.array(pattern.mantissa, dtype=pattern.view)) == 0
            if pattern.mantissa is not None
            else np.zeros(len(values), dtype=bool)
        )
        inf += int(infinite.sum())
        nan += int(len(values) - infinite.sum())
        if first is None:
            sign = int(values[0]) >> (8 * size - 1)
            kind = ("-inf" if sign else "+inf") if infinite[0] else "NaN"
            first = ((offset - start) // size + int(where[0]), kind)
    if first is None:
        return None
    return NonFinite(first[0], first[1], nan, inf, (end - start) // size)


def check_finite(
    root: Path,
    tensors: Iterable[StoredFloat],
    *,
    report: Callable[[NonFiniteValueError, bool], None],
    fatal: Callable[[str], bool] = lambda _: False,
) -> int:
    """Scan every float tensor of ``tensors`` (files under ``root``); return the bytes read.

    Each tensor holding NaN or inf is handed to ``report`` as a :class:`NonFiniteValueError`, with
    ``fatal(name)`` (a quantized weight's float plane: the caller refuses it whatever its switch says).
    The files are read in their order, each once, ``CHUNK_BYTES`` at a time.
    """
    by_file: dict[str, list[StoredFloat]] = {}
    for t in tensors:
        if float_dtype(t.dtype) and t.end > t.start:
            by_file.setdefault(t.file, []).append(t)
    checked = 0
    for rel, members in sorted(by_file.items()):
        path = root / rel
        with path.open("rb") as handle:
            for t in sorted(members, key=lambda t: t.start):
                found = scan(handle, t.start, t.end, t.dtype)
                checked += t.end - t.start
                if found is not None:
                    report(_error(str(path), t, found, fatal(t.name)), fatal(t.name))
    return checked


def _error(file: str, t: StoredFloat, found: NonFinite, fatal: bool) -> NonFiniteValueError:
    remedy = (
        "a quantized weight's float plane (scales, zero points) must be finite; --allow-nonfinite does "
        "not cover it: re-quantize the weight"
        if fatal
        else "re-export the checkpoint without them; a checkpoint that really stores them can be pushed "
        "with --allow-nonfinite, which records this as a note"
    )
    return NonFiniteValueError(
        file,
        tensor=t.name,
        field="values",
        expected=f"finite {t.dtype} values (no NaN, no inf)",
        found=found.describe(),
        remedy=remedy,
    )
