"""Dispatch in a requested activation dtype, with the float32 fallback said in the traces (never silent).

The one owner, with :mod:`.selection`, of which kernel runs an operator: a bring-up asks for its
activation dtype (``registry up --activations``) and :func:`dispatch_activations` decides per weight
whether the operator runs in it or falls back to float32, and why. :func:`note_float32` is the note
every such trace carries (also for an operator the caller itself keeps in float32, e.g. the output head).
"""

from __future__ import annotations

from typing import Any

from .admission import Reason
from .capability import ActivationDtype, Phase
from .catalog import Catalog, slow_path
from .errors import NoAdmissibleKernelError
from .prepared import PreparedLinear
from .selection import DispatchTrace, dispatch_phases
from .weight import RankWeight

#: The operator of each phase with its trace (what :func:`~.selection.dispatch_phases` returns).
Chosen = dict[Phase, tuple[PreparedLinear, DispatchTrace]]


def _dtype_only(trace: DispatchTrace, catalog: Catalog) -> list[str]:
    """Kernels ranked before the selected one that refused the operator for its activation dtype alone.

    Only those on their fast path in float32 (a kernel slow in float32 is not worth running there
    instead of the selected one in the requested dtype).
    """
    fast32 = {
        f"{k.capability.id}@{k.capability.version}" for k in catalog if not slow_path(k.capability, "float32")
    }
    out = []
    for c in trace.candidates:
        if c.selected:
            break
        if c.admission.refusals and all(r.reason == Reason.ACTIVATION_DTYPE for r in c.admission.refusals):
            if c.kernel in fast32:
                out.append(c.kernel)
    return out


def note_float32(chosen: Chosen, requested: ActivationDtype, why: str) -> Chosen:
    """``chosen`` with each trace saying that the operator runs float32 instead of ``requested``, and why."""
    out: Chosen = {}
    for phase, (op, trace) in chosen.items():
        note = f"{trace.weight} ({phase}): activations {requested} requested; runs float32: {why}"
        out[phase] = (op, trace.model_copy(update={"warnings": (*trace.warnings, note)}))
    return out


def dispatch_activations(
    weight: RankWeight,
    catalog: Catalog,
    activations: ActivationDtype,
    **kwargs: Any,
) -> Chosen:
    """Dispatch a rank's ``weight`` for prefill and decode with ``activations``.

    float32 is dispatched as is. Another dtype is admitted where the kernel that runs the operator takes
    it; the operator falls back to float32 — and each of its traces says so, with the reason (never
    silently) — where no kernel admits the dtype, or where a kernel ranked before the one selected
    refused the operator for its activation dtype alone (that kernel runs it in float32 rather than a
    lower-ranked one in the requested dtype), unless float32 is that kernel's slow path. ``kwargs``:
    :func:`~.selection.dispatch_phases`'s.
    """
    if activations == "float32":
        return dispatch_phases(weight, catalog, activation_dtype="float32", **kwargs)
    try:
        chosen = dispatch_phases(weight, catalog, activation_dtype=activations, **kwargs)
    except NoAdmissibleKernelError as exc:
        fallback = dispatch_phases(weight, catalog, activation_dtype="float32", **kwargs)
        return note_float32(fallback, activations, f"no kernel admits {activations} here ({exc.found})")
    ahead = sorted({k for _, trace in chosen.values() for k in _dtype_only(trace, catalog)})
    if not ahead:
        return chosen
    fallback = dispatch_phases(weight, catalog, activation_dtype="float32", **kwargs)
    why = f"{', '.join(ahead)} ranked first, refusing {activations} only"
    return note_float32(fallback, activations, why)
