"""The evidence predicate's parity rows, typed, and the verdict recomputed from them.

A bring-up's evidence (:mod:`.evidence`) carries a ``parity`` list: one row per check, each with a
``status`` (``pass``, ``fail``, ``not applicable``, ``not run``), the measured ``value``, the
``tolerance`` it was held to and where that tolerance comes from (``tolerance_source``), and how many
quantities the row measured (``measured``). :class:`ParityRow` and :class:`EvidencePredicate` are the
typed form both the bring-up (which writes them) and ``registry verify`` (which reads them) use.

:func:`verdict_findings` recomputes a statement's verdict from its rows alone: ``passed`` must equal
"every row that ran passed" (and at least one ran); each row's ``passed`` must agree with its
``status``; a ``pass`` row whose value and tolerance are both numbers must have ``value <= tolerance``
(finite); a ``pass`` row must have measured something. A statement that disagrees is a finding: the
signature proves who said it, not that it is consistent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

Status = Literal["pass", "fail", "not applicable", "not run"]
"""A row's outcome; only ``pass`` and ``fail`` ran (``passed`` True / False; the others None)."""
RAN: tuple[Status, ...] = ("pass", "fail")
Number = int | float


class ParityRow(BaseModel):
    """One row of the parity table: what was measured, against what, from where, and the outcome.

    Other fields a newer bring-up adds are kept (``extra="allow"``): a reader checks what it knows.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    level: str
    name: str
    status: Status
    passed: bool | None
    """``status == "pass"`` (True), ``"fail"`` (False), else None (the row did not run)."""
    value: Number | str | None = None
    """The measured quantity (a non-finite measure is written as text: ``"NaN"``)."""
    tolerance: Number | str | None = None
    tolerance_source: str | None = None
    """Where the tolerance comes from (a policy, a manifest field, a derivation); None: no tolerance."""
    measured: int | None = None
    """How many quantities the row measured (traces, positions, ranks, buffers...)."""
    detail: str = ""

    @model_validator(mode="before")
    @classmethod
    def _older(cls, data: Any) -> Any:
        """A row written before ``status`` existed: its status from its ``passed`` (None: not run)."""
        if isinstance(data, Mapping) and "status" not in data:
            return {**data, "status": status_of(data.get("passed"))}
        return data


class EvidencePredicate(BaseModel):
    """The evidence predicate's top level as ``registry verify`` reads it (the rest is the bring-up's)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    manifest: str
    repository: str
    passed: bool
    parity: tuple[ParityRow, ...]
    created: str | None = None


def status_of(passed: bool | None, status: str | None = None) -> Status:
    """A row's status from its ``passed`` (a None keeps the row's own ``not applicable``/``not run``)."""
    if passed is None:
        return "not applicable" if status == "not applicable" else "not run"
    return "pass" if passed else "fail"


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def row_findings(row: ParityRow) -> list[str]:
    """What in one row contradicts itself (empty: consistent)."""
    out: list[str] = []
    where = f"row {row.level} {row.name!r}"
    want = {"pass": True, "fail": False}.get(row.status)
    if row.passed is not want:
        out.append(f"{where}: status {row.status!r} but passed {row.passed!r}")
    if row.status != "pass":
        return out
    value, tol = _number(row.value), _number(row.tolerance)
    if isinstance(row.value, str) or isinstance(row.tolerance, str):
        out.append(f"{where}: passes with a non-finite value or tolerance ({row.value} vs {row.tolerance})")
    elif value is not None and tol is not None and not (math.isfinite(value) and math.isfinite(tol)):
        out.append(f"{where}: passes with a non-finite value or tolerance ({value} vs {tol})")
    elif value is not None and tol is not None and value > tol:
        out.append(f"{where}: passes with value {row.value} above its tolerance {row.tolerance}")
    if row.measured is not None and row.measured <= 0:
        out.append(f"{where}: passes having measured nothing (measured {row.measured})")
    return out


def verdict_findings(predicate: Mapping[str, Any]) -> list[str]:
    """Where a stored predicate's verdict disagrees with its rows (empty: it agrees).

    The verdict is recomputed as: every row that ran (``pass``/``fail``) passed, and at least one ran.
    """
    try:
        pred = EvidencePredicate.model_validate(predicate)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        return [f"predicate does not parse as evidence: {at}: {first['msg']}"]
    out = [f for row in pred.parity for f in row_findings(row)]
    ran = [r for r in pred.parity if r.status in RAN]
    recomputed = bool(ran) and all(r.status == "pass" for r in ran)
    if pred.passed != recomputed:
        failed = [f"{r.level} {r.name!r}" for r in ran if r.status != "pass"]
        why = (
            f"failing rows: {', '.join(failed)}"
            if failed
            else "no row ran"
            if not ran
            else "all ran rows pass"
        )
        out.append(f"passed is {pred.passed}, its rows say {recomputed} ({why})")
    return out
