"""The evidence rows of parity L1-L3 over the ranks' ladder records (:func:`.up_evidence._ladder_rows`).

Each row measures a quantity against a tolerance from an independent source, or says it could not:

- L1: codes (or a direct kernel's values) compared exactly; ``"status": "not applicable"`` with
  ``passed`` None and the reasons when no ladder compared any code -- never a pass over 0 codes.
- L2: the largest ``|W_layout - W_ref|``; each element held to its conversion budget (0 for a layout
  that only permutes), the budgets' sources named (:mod:`shardport.kernels.budget`).
- L3: the largest ``E_kernel`` against the kernel's accumulation tolerance plus the operator bound of
  its L2 budget; the measured conversion error is recorded by the ranks, never a tolerance term.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .up_finite import worst


def capped_error(batch: Mapping[str, Any]) -> float:
    """An L3 batch's ``e_kernel``, no larger than its own L3 tolerance (NaN stays NaN: ``>`` is False).

    What L4's tolerance takes from a batch (:func:`.up_evidence.tolerance`): a kernel over its L3
    tolerance fails L3, it does not widen L4. Records without ``tol_kernel`` give ``e_kernel``.
    """
    e_kernel = float(batch["e_kernel"])
    if "tol_kernel" not in batch:
        return e_kernel
    cap = float(batch["tol_kernel"]) + float(batch.get("tol_conversion", 0.0))
    return cap if e_kernel > cap else e_kernel


def sources(records: Iterable[Mapping[str, Any]]) -> str:
    """The distinct tolerance sources of some level records (records written before them: "not recorded")."""
    found = sorted({str(x.get("tolerance_source") or "not recorded") for x in records})
    return "; ".join(found) if found else "none"


def l1_row(ladders: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """L1: "not applicable" (``passed`` None) when no ladder compared a code, never a pass over 0."""
    name = "codes preserved by every layout"
    compared = sum(int(lad["l1"]["codes_compared"]) for lad in ladders)
    none = [lad for lad in ladders if not int(lad["l1"]["codes_compared"])]
    reasons = sorted({str(lad["l1"].get("reason") or "nothing read back") for lad in none})
    if not compared:
        return {
            "level": "L1",
            "name": name,
            "passed": None,
            "status": "not applicable",
            "value": None,
            "tolerance": None,
            "detail": f"no code compared on {len(ladders)} operators: {'; '.join(reasons) or 'no ladder'}",
        }
    how = Counter(str(lad["l1"].get("readback", "kernel")) for lad in ladders if lad not in none)
    detail = f"{compared} codes compared exactly on {len(ladders) - len(none)} of {len(ladders)} operators"
    detail += f" (read back: {', '.join(f'{k} {v}' for k, v in sorted(how.items()))})"
    if none:
        detail += f"; not applicable on {len(none)}: {'; '.join(reasons)}"
    failed = [lad for lad in ladders if not lad["l1"]["passed"]]
    detail += "".join(f"; FAIL {lad['weight']}: {lad['l1'].get('first_mismatch')}" for lad in failed[:3])
    return {
        "level": "L1",
        "name": name,
        "passed": all(bool(lad["l1"]["passed"]) for lad in ladders),
        "value": sum(int(lad["l1"]["mismatches"]) for lad in ladders),
        "tolerance": 0,
        "tolerance_source": "exact: the planes' codes (a direct kernel's reference values) as stored",
        "detail": detail,
    }


def l2_row(
    ladders: Sequence[Mapping[str, Any]],
    full: Sequence[Mapping[str, Any]],
    scope: str,
    gaps: str,
    covered: bool,
) -> dict[str, Any]:
    """L2: the witness comparison on every ladder, the reconstruction on the ``full`` ones."""
    witnessed = sum(int(lad["l2"]["witness_checked"]) for lad in ladders)
    return {
        "level": "L2",
        "name": "layout decode = reference decode; witness rows",
        "passed": all(lad["l2"]["passed"] for lad in ladders) and covered,
        "value": worst(float(lad["l2"]["max_abs_error"]) for lad in full),
        "tolerance": worst(float(lad["l2"]["tolerance"]) for lad in full),
        "tolerance_source": sources(lad["l2"] for lad in full),
        "detail": f"{witnessed} witness cells or rows on all {len(ladders)} operators; reconstruction: "
        f"{scope}; each element within its own budget (the largest shown)" + (f"; {gaps}" if gaps else ""),
    }


def l3_row(full: Sequence[Mapping[str, Any]], scope: str, gaps: str, covered: bool) -> dict[str, Any]:
    """L3: the golden batches of the ``full`` ladders, each against its own tolerance."""
    l3 = [x for lad in full for x in lad["l3"]]
    return {
        "level": "L3",
        "name": "operator error vs reference (max E_kernel)",
        "passed": all(x["passed"] for x in l3) and covered,
        "value": worst(float(x["e_kernel"]) for x in l3),
        "tolerance": worst(float(x["tol_kernel"]) + float(x.get("tol_conversion", 0.0)) for x in l3),
        "tolerance_source": sources(l3),
        "detail": f"{len(l3)} golden batches; {scope}; tolerance: the kernel's accumulation tolerance "
        "+ the operator bound of its L2 budget, never the measured conversion error"
        + (f"; {gaps}" if gaps else ""),
    }
