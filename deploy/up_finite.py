"""The evidence's numbers, finite or failing: a measured NaN or infinity never reaches a signature.

Canonical JSON (RFC 8785) has no NaN and no infinity, and a top-1 agreement between two NaN vectors
proves nothing. Every maximum here keeps a NaN (:func:`worst`), every bound needs two finite numbers
(:func:`within`), and the predicate is sealed (:func:`seal`): each non-finite value is written as
text, fails its row, the row :data:`FINITE_ROW` and the whole predicate; the bring-up still signs and
stores it, and exits 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from shardport.provenance.canonical import check_finite, finite_text
from shardport.provenance.errors import NonFiniteNumberError

#: The row that proves the predicate holds only finite numbers (:func:`seal`).
FINITE_ROW = "every measured value finite"


def worst(values: Iterable[float], default: float = 0.0) -> float:
    """The largest of ``values``, or NaN when one is NaN (``max`` keeps or drops a NaN by position)."""
    out = default
    for i, v in enumerate(values):
        v = float(v)
        if math.isnan(v):
            return v
        out = v if i == 0 else max(out, v)
    return out


def within(value: Any, bound: Any) -> bool:
    """``value <= bound`` with both finite numbers (a NaN, an infinity or a string never passes)."""
    if not isinstance(value, int | float) or not isinstance(bound, int | float):
        return False
    return math.isfinite(value) and math.isfinite(bound) and value <= bound


def finite_row() -> dict[str, Any]:
    """The row :data:`FINITE_ROW`, passing until :func:`seal` finds a non-finite value."""
    return {
        "level": "L5",
        "name": FINITE_ROW,
        "passed": True,
        "value": 0,
        "tolerance": 0,
        "detail": "every number in the evidence is finite",
    }


def seal(pred: dict[str, Any]) -> dict[str, Any]:
    """``pred`` as canonical JSON can sign it: each NaN or infinity written as text, and failing.

    The one check the statement's canonicalisation runs (:func:`shardport.provenance.canonical.check_finite`)
    names every non-finite value by its JSON pointer; here each becomes ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"``, a parity row whose value or tolerance it is fails, and so do the row
    :data:`FINITE_ROW` (value: how many) and the whole predicate. Idempotent: run again after fields
    are added (the bring-up's attempts), it counts only what is new. A predicate without the row
    gets one.
    """
    try:
        check_finite(pred)
        return pred
    except NonFiniteNumberError as exc:
        paths = exc.paths
    out: dict[str, Any] = finite_text(pred)
    rows = out.setdefault("parity", [])
    row = next((r for r in rows if r.get("name") == FINITE_ROW), None)
    if row is None:
        row = finite_row()
        rows.append(row)
    for path in paths:
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "parity" and parts[3] in ("value", "tolerance"):
            failed = rows[int(parts[2])]
            failed["passed"] = False
            failed["detail"] = f"{failed.get('detail') or ''}; {parts[3]} not finite".lstrip("; ")
    count = int(row["value"]) + len(paths) if row["passed"] is False else len(paths)
    shown = ", ".join(f"{p} = {_text_at(out, p)}" for p in paths[:8])
    more = f" and {len(paths) - 8} more" if len(paths) > 8 else ""
    earlier = f"{row['detail']}; " if row["passed"] is False else ""
    row.update(passed=False, value=count, detail=f"{earlier}not finite: {shown}{more}")
    out["passed"] = False
    return out


def _text_at(doc: Any, pointer: str) -> Any:
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(key)] if isinstance(doc, list) else next(v for k, v in doc.items() if str(k) == key)
    return doc
