"""The E_quant evidence row: a quantized checkpoint's distance from its float reference, apart from E_kernel.

E_kernel (the L3 ladder row) measures a kernel against the registry's reference decode; E_quant measures
that decode against the float weights it quantizes. Push measures it once, with ``--reference FLOATDIR``
(:mod:`shardport.registry.contracts.quant_error`), and records it per weight in the manifest's
``quantization.quant_error``. This module turns that record into one row of the parity table; it reads
nothing but the (verified) manifest.
"""

from __future__ import annotations

from typing import Any

from shardport.registry.artifact.manifest import Manifest

NAME = "E_quant vs float reference (push --reference)"
TOLERANCE_SOURCE = (
    "each weight's rounding bound in aggregate, ‖B‖/‖W_fp‖ (B: half the quantization step plus scale "
    "rounding per element, from the stored scales; recorded at push)"
)


def quant_error_row(manifest: Manifest) -> dict[str, Any]:
    """The L3 E_quant row of ``manifest``: passed when every weight's E_quant is within its tolerance.

    ``value``: the largest E_quant of any weight; ``tolerance``: that weight's. "not applicable" (with
    the reason) when the manifest records no E_quant (pushed without ``--reference``).
    """
    row: dict[str, Any] = {"level": "L3", "name": NAME, "tolerance_source": TOLERANCE_SOURCE}
    summary = manifest.quantization.quant_error
    if not summary:
        why = (
            "a float checkpoint: nothing was quantized"
            if manifest.quantization.family == "none"
            else "pushed without --reference: no float reference to measure E_quant against"
        )
        return row | {
            "status": "not applicable",
            "passed": None,
            "value": None,
            "tolerance": None,
            "detail": f"the manifest records no E_quant ({why})",
        }
    top = max(summary, key=lambda name: (summary[name].e_quant, name))
    over = sorted(name for name, q in summary.items() if not q.e_quant <= q.tolerance)
    worst = max(summary, key=lambda name: (_ratio(summary[name].e_quant, summary[name].tolerance), name))
    clipped = sum(q.clipped for q in summary.values())
    detail = (
        f"{len(summary)} weights on {summary[top].tokens} seeded golden tokens each; largest E_quant at "
        f"{top}; worst E_quant/tolerance {_ratio(summary[worst].e_quant, summary[worst].tolerance):.3g} "
        f"at {worst}; {clipped} clipped elements"
    )
    if over:
        shown = ", ".join(
            f"{name} ({summary[name].e_quant:.4g} > {summary[name].tolerance:.4g})" for name in over[:3]
        )
        detail += f"; over tolerance: {shown}" + (f" and {len(over) - 3} more" if len(over) > 3 else "")
    return row | {
        "status": "fail" if over else "pass",
        "passed": not over,
        "value": summary[top].e_quant,
        "tolerance": summary[top].tolerance,
        "measured": len(summary),
        "detail": detail,
    }


def _ratio(value: float, tolerance: float) -> float:
    """``value / tolerance``; infinite for a positive value against a zero tolerance."""
    if tolerance > 0:
        return value / tolerance
    return 0.0 if value == 0 else float("inf")
