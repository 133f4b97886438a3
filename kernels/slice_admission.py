"""Admission of one rank's weight slice from the manifest alone: before any byte is read.

Dispatch (:mod:`.selection`) admits, prepares and selects on the rank, after the load. What it can only
refuse there — no kernel's capability takes the operator, or the policy forbids every kernel that does
— it can equally refuse from the signature, which needs the weight's contract and the slice's bounds
and no plane (:func:`~.weight.slice_weight`). :func:`refusals` walks dispatch's order
(:func:`~.catalog.ordered`) the way :func:`~.selection.dispatch` does up to preparation, for both
phases, with :func:`~.activations.dispatch_activations`' float32 fallback; a slice it passes may still
be refused at preparation (a conversion a stricter policy forbids): the check is sound, not complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from .admission import Admission, Reason, Refusal, admit
from .capability import ActivationDtype, OperatorSignature, Phase, operator_signature
from .catalog import Catalog, Kernel, named, ordered
from .device import Device
from .policy import FallbackPolicy
from .weight import RankWeight

PHASES: tuple[Phase, ...] = ("prefill", "decode")


def first_admitted(
    op: OperatorSignature, kernels: Sequence[Kernel], policy: FallbackPolicy, required: Sequence[str]
) -> tuple[Kernel | None, list[Admission]]:
    """The first of ``kernels`` dispatch would try to prepare for ``op``, and the refusals before it.

    Admitted by its capability, named by ``required`` (when given), its declared class not forbidden by
    ``policy``: :func:`~.selection.dispatch`'s walk up to preparation.
    """
    refused: list[Admission] = []
    for kernel in kernels:
        cap = kernel.capability
        verdict = admit(op, cap)
        extra: list[Refusal] = []
        if required and not named(kernel, required):
            extra.append(
                Refusal(reason=Reason.NOT_REQUIRED, expected=f"one of {list(required)}", found=cap.id)
            )
        elif verdict.accepted and policy.mode(cap.transformation) == "forbid":
            extra.append(
                Refusal(reason=Reason.POLICY, expected=f"a class {policy} allows", found=cap.transformation)
            )
        if verdict.accepted and not extra:
            return kernel, refused
        name = f"{cap.id}@{cap.version}"
        refused.append(Admission(kernel=name, accepted=False, refusals=(*verdict.refusals, *extra)))
    return None, refused


def _walk(
    weight: RankWeight,
    catalog: Catalog,
    dtype: ActivationDtype,
    phase: Phase,
    device: Device,
    policy: FallbackPolicy,
    required: Sequence[str],
    preferred: Sequence[str],
) -> tuple[Kernel | None, list[Admission]]:
    """:func:`first_admitted` for ``weight`` in ``phase``, in dispatch's order for ``dtype``."""
    op = operator_signature(weight, dtype, phase, device)
    return first_admitted(op, ordered(catalog, dtype, preferred), policy, required)


def refusals(
    weight: RankWeight,
    catalog: Catalog,
    *,
    activations: ActivationDtype,
    device: Device,
    policy: FallbackPolicy,
    required: Sequence[str] = (),
    preferred: Sequence[str] = (),
) -> str | None:
    """Why no kernel would run ``weight`` in some phase (each candidate's reasons), or None."""
    for phase in PHASES:
        chosen, refused = _walk(weight, catalog, activations, phase, device, policy, required, preferred)
        if chosen is None and activations != "float32":  # dispatch_activations falls back to float32
            chosen, refused = _walk(weight, catalog, "float32", phase, device, policy, required, preferred)
        if chosen is None:
            listed = "; ".join(_brief(a) for a in refused) or "no kernel in the catalogue"
            return f"{phase}: {listed}"
    return None


def _brief(admission: Admission) -> str:
    """``kernel (reason: found, ...)``: what each refusal found, without the long expected lists."""
    found = ", ".join(f"{r.reason.value}: {r.found}" for r in admission.refusals)
    return f"{admission.kernel} ({found})"
