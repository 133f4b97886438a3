"""The report's two parity charts, written as static SVG: L3 operator error per layer, L4 |Δ| per position.

- L3: per layer (:func:`.report_views.layer_of`; weights without one, each its own slot at the end)
  the largest relative operator error ``E_kernel`` any of its operators showed, on a log scale, with
  the layer's tightest tolerance as a tick. Read from the predicate's ``parity_l3`` (one record per
  operator: ``weight``, ``e_kernel``, ``tolerance`` or ``tol_kernel`` + ``tol_conversion`` (records
  before it: ``e_conversion``), ``passed``, optionally ``rank``/``kernel``) or else ``ladders`` (the
  ranks' ladder records, each with ``weight`` and its ``l3`` golden batches). Neither: the chart says
  so.
- L4: ``|Δ|`` of the logits against the reference per prompt position and decode step, with the
  tolerance as a line. Read from ``parity_l4``: ``per_position_abs_diff`` (a list: the prompt positions;
  or ``{"prompt": [...], "decode": [...]}``) and ``decode_per_step_abs_diff``; without them the maxima
  ``max_abs_diff`` and ``decode_max_abs_diff`` are drawn as the two bars that exist, and the page says
  the per-position values are missing.

A value that is not a finite number (``"NaN"``) is drawn as nothing and named under the chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .report_views import esc, fmt, layer_of, number, rows_of

_W, _H, _LEFT, _TOP, _BOTTOM = 760, 190, 56, 10, 34


@dataclass(frozen=True)
class Slot:
    """One bar: its label, value, tolerance (either may be missing or non-finite), and its hover text."""

    label: str
    value: float | None
    tolerance: float | None
    failed: bool
    note: str
    series: str = "a"
    count: int = 1


def _conversion_term(batch: Mapping[str, Any]) -> float:
    """An L3 batch's conversion term of its tolerance: ``tol_conversion``, else ``e_conversion``.

    ``tol_conversion`` is the operator bound of the L2 budget; records written before it passed at
    ``tol_kernel + e_conversion``.
    """
    if "tol_conversion" in batch:
        return number(batch.get("tol_conversion")) or 0.0
    return number(batch.get("e_conversion")) or 0.0


def _l3_rows(evidence: Mapping[str, Any]) -> list[tuple[str, float | None, float | None, bool]]:
    """(weight, E_kernel, tolerance, passed) per operator, from ``parity_l3`` or the ``ladders``."""
    out = []
    for rec in rows_of(evidence.get("parity_l3")):
        if "weight" in rec:
            tol = number(rec.get("tolerance"))
            if tol is None and number(rec.get("tol_kernel")) is not None:
                tol = float(rec["tol_kernel"]) + _conversion_term(rec)
            out.append((str(rec["weight"]), number(rec.get("e_kernel")), tol, rec.get("passed") is not False))
    if out:
        return out
    for lad in rows_of(evidence.get("ladders")):
        batches = rows_of(lad.get("l3"))
        if not batches:
            continue
        errors = [number(x.get("e_kernel")) for x in batches]
        tols = [(number(x.get("tol_kernel")) or 0.0) + _conversion_term(x) for x in batches]
        finite = [e for e in errors if e is not None and math.isfinite(e)]
        worst = max(finite) if len(finite) == len(errors) else math.nan
        out.append(
            (str(lad.get("weight")), worst, min(tols), all(x.get("passed") is not False for x in batches))
        )
    return out


def l3_slots(evidence: Mapping[str, Any]) -> list[Slot]:
    """A slot per layer (then per weight without one): the worst E_kernel, the tightest tolerance."""
    groups: dict[tuple[int, str], list[tuple[str, float | None, float | None, bool]]] = {}
    for row in _l3_rows(evidence):
        layer = layer_of(row[0])
        spot = (0, f"{layer:05d}") if layer is not None else (1, row[0].split("[")[0])
        groups.setdefault(spot, []).append(row)
    slots = []
    for (kind, key), rows in sorted(groups.items()):
        values = [r[1] for r in rows]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        value = max(finite) if len(finite) == len(values) else None if None in values else math.nan
        tols = [t for t in (r[2] for r in rows) if t is not None and math.isfinite(t)]
        label = str(int(key)) if kind == 0 else key
        slots.append(Slot(
            label, value, min(tols) if tols else None, not all(r[3] for r in rows),
            f"{'layer ' + label if kind == 0 else label}: max E_kernel {fmt(value)}, tolerance "
            f"{fmt(min(tols)) if tols else '-'}, {len(rows)} operators", count=len(rows),
        ))  # fmt: skip
    return slots


def _series(value: Any) -> list[float | None]:
    return [number(v) for v in value] if isinstance(value, Sequence) and not isinstance(value, str) else []


def l4_slots(parity: Mapping[str, Any]) -> tuple[list[Slot], bool]:
    """The |Δ| bars (prompt positions, then decode steps) and whether they are per position."""
    tol = number(parity.get("tolerance"))
    per = parity.get("per_position_abs_diff")
    prompt = _series(per.get("prompt") if isinstance(per, Mapping) else per)
    decode = _series(
        per.get("decode") if isinstance(per, Mapping) else parity.get("decode_per_step_abs_diff")
    )
    if prompt or decode:
        slots = [Slot(str(i), v, tol, not _within(v, tol), f"prompt position {i}: |Δ| {fmt(v)}")
                 for i, v in enumerate(prompt)]  # fmt: skip
        slots += [Slot(f"d{i}", v, tol, not _within(v, tol), f"decode step {i}: |Δ| {fmt(v)}", "b")
                  for i, v in enumerate(decode)]  # fmt: skip
        return slots, True
    slots = []
    for key, label, series in (
        ("max_abs_diff", "prompt (max)", "a"),
        ("decode_max_abs_diff", "decode (max)", "b"),
    ):
        if key in parity:
            v = number(parity[key])
            slots.append(Slot(label, v, tol, not _within(v, tol), f"{label}: |Δ| {fmt(v)}", series))
    return slots, False


def _within(value: float | None, tol: float | None) -> bool:
    return value is not None and tol is not None and math.isfinite(value) and value <= tol


def chart(slots: Sequence[Slot], *, log: bool, name: str, unit: str) -> str:
    """A bar per slot with its tolerance as a tick; a log or a linear axis from 0. Static SVG."""
    if not slots:
        return "<p>no data</p>"
    seen = [v for s in slots for v in (s.value, s.tolerance) if v is not None and math.isfinite(v)]
    seen = [v for v in seen if v > 0] if log else seen
    top = max(seen, default=1.0) or 1.0
    low = math.floor(math.log10(min(seen))) if log and seen else -8
    high = max(math.ceil(math.log10(top)), low + 1)
    top = top if log else top * 1.1

    def to_y(v: float) -> float:
        """The value's height on the axis (log: from 10^low, anything at or below it on the floor)."""
        if not log:
            return _TOP + _H - _H * v / top
        return _TOP + _H - (max(math.log10(v), low) - low) * _H / (high - low) if v > 0 else _TOP + _H

    if log:
        ticks = [(10.0**e, f"1e{e}") for e in range(low, high + 1)]
    else:
        ticks = [(top * i / 4, f"{top * i / 4:.3g}") for i in range(5)]
    step = (_W - _LEFT - 10) / len(slots)
    bar = max(min(step * 0.7, 28), 1.0)
    out = [f'<svg width="{_W}" height="{_TOP + _H + _BOTTOM}" role="img" aria-label="{esc(name)}">']
    for v, text in ticks:
        y = to_y(v)
        out.append(f'<line x1="{_LEFT}" x2="{_W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e9ed"/>'
                   f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')  # fmt: skip
    every = max(1, math.ceil(len(slots) / 40))
    for i, s in enumerate(slots):
        x = _LEFT + i * step + (step - bar) / 2
        if s.value is not None and math.isfinite(s.value):
            y = to_y(s.value)
            fill = "#b42318" if s.failed else ("#4e79a7" if s.series == "a" else "#f28e2b")
            tall = max(_TOP + _H - y, 1)
            out.append(f'<rect class="{name}" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{tall:.1f}" '
                       f'fill="{fill}"><title>{esc(s.note)}</title></rect>')  # fmt: skip
        if s.tolerance is not None and math.isfinite(s.tolerance):
            y = to_y(s.tolerance)
            out.append(f'<line class="{name}-tol" x1="{x - 2:.1f}" x2="{x + bar + 2:.1f}" y1="{y:.1f}" '
                       f'y2="{y:.1f}" stroke="#1b1f24" stroke-width="2"/>')  # fmt: skip
        if i % every == 0:
            out.append(
                f'<text x="{x + bar / 2:.1f}" y="{_TOP + _H + 14}" text-anchor="middle">{esc(s.label)}</text>'
            )
    out.append(
        f'<text x="{_LEFT}" y="{_TOP + _H + 30}">{esc(unit)}; black ticks: tolerance; red: failed</text>'
    )
    odd = [s.label for s in slots if s.value is not None and not math.isfinite(s.value)]
    missing = [s.label for s in slots if s.value is None]
    notes = ([f"not finite: {', '.join(odd)}"] if odd else []) + (
        [f"no value: {', '.join(missing)}"] if missing else []
    )
    return "".join(out) + "</svg>" + "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
