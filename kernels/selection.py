"""Dispatch: pick, per weight, rank and phase, the kernel that runs it — and say why, as data.

Candidates are walked in the order :func:`~.catalog.ordered` gives for the activation dtype: the
manifest's ``runtime.kernels_preferred`` first, then the kernels on their fast path in catalog order,
then those on their slow path for the dtype (``Capability.slow_activations``: admitted, but
unvectorised — each such candidate's line says so), then the fallback classes; with
``runtime.kernels_required`` only those ids may be selected (the others are recorded as refused
``not_required``). Each candidate is admitted (:func:`~.admission.admit`), its declared
transformation class checked against the fallback policy, then prepared; a preparation that turns out
to be a ``conversion`` is checked again. The first that passes is selected; the remaining candidates
are still admitted for the trace, not prepared. A weight with no admissible kernel raises
:class:`NoAdmissibleKernelError` (or :class:`FallbackForbiddenError` where only the policy stood in the
way) listing every candidate's reasons — never a silent slow path: a kernel selected on its slow path
(nothing on a fast path was selectable, or the manifest preferred it) is noted in the trace's
``warnings``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from shardport.registry.errors import RefusedError

from .admission import Admission, Reason, Refusal, admit
from .capability import ActivationDtype, OperatorSignature, Phase, Transformation, operator_signature
from .catalog import Catalog, Kernel, named, ordered, slow_path
from .device import Device, this_cpu
from .errors import FallbackForbiddenError, KernelError, NoAdmissibleKernelError
from .policy import FallbackPolicy
from .prepared import PreparedLinear
from .weight import RankWeight


class FallbackWarning(UserWarning):
    """A fallback the policy lets through with ``warn``."""


class Candidate(BaseModel):
    """One candidate's outcome: its admission, and whether it was prepared and selected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kernel: str
    admission: Admission
    prepared: bool
    selected: bool
    transformation: Transformation | None
    conversion_error: float | None
    note: str | None = None
    """Why the candidate stands where it does when that is not its catalog place (a slow path)."""


class DispatchTrace(BaseModel):
    """Per weight, rank and phase: what was asked, what every candidate said, what was chosen and done."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: str
    phase: Phase
    requested: OperatorSignature
    policy: FallbackPolicy
    required: tuple[str, ...]
    preferred: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    selected: str
    transformation: Transformation
    conversion_error: float
    warnings: tuple[str, ...]


def _slow_note(kernel: Kernel, dtype: ActivationDtype, preferred: Sequence[str]) -> str | None:
    """A slow-path candidate's note: why it stands after the fast-path kernels (or before them)."""
    if not slow_path(kernel.capability, dtype):
        return None
    if named(kernel, preferred):
        return f"slow path for {dtype} (unvectorised); tried first: the manifest prefers it"
    return f"slow path for {dtype} (unvectorised); tried after the kernels on their fast path"


def _refused(kernel: str, admission: Admission, reason: Reason, expected: str, found: str) -> Admission:
    refusal = Refusal(reason=reason, expected=expected, found=found)
    return Admission(kernel=kernel, accepted=False, refusals=(*admission.refusals, refusal))


def _listing(outcomes: Sequence[Candidate]) -> str:
    return "; ".join(str(c.admission) for c in outcomes) or "no candidates"


def _candidate(
    name: str,
    verdict: Admission,
    prepared: PreparedLinear | None = None,
    *,
    transformation: Transformation | None = None,
    selected: bool = False,
) -> Candidate:
    """One candidate's line of the trace."""
    return Candidate(
        kernel=name,
        admission=verdict,
        prepared=prepared is not None,
        selected=selected,
        transformation=prepared.transformation if prepared is not None else transformation,
        conversion_error=prepared.conversion_error if prepared is not None else None,
    )


def _try(
    kernel: Kernel,
    name: str,
    verdict: Admission,
    weight: RankWeight,
    op: OperatorSignature,
    policy: FallbackPolicy,
    reuse: Mapping[str, PreparedLinear] | None,
) -> tuple[Candidate, PreparedLinear | None]:
    """An admitted kernel under the policy: refused by class, refused at preparation, or prepared."""
    cap = kernel.capability
    allows = f"a class the policy allows ({policy})"
    if policy.mode(cap.transformation) == "forbid":
        verdict = _refused(name, verdict, Reason.POLICY, allows, cap.transformation)
        return _candidate(name, verdict, transformation=cap.transformation), None
    try:
        prepared = (reuse or {}).get(name) or kernel.prepare(weight, op)
    except (KernelError, RefusedError) as exc:  # contract and kernel-input refusals
        refused = _refused(name, verdict, Reason.PREPARE, "a preparable weight", str(exc))
        return _candidate(name, refused), None
    done = prepared.transformation
    if policy.mode(done) == "forbid":
        found = f"{done} (max reconstruction error {prepared.conversion_error:g})"
        refused = _refused(name, verdict, Reason.POLICY, allows, found)
        return _candidate(name, refused, prepared), None
    return _candidate(name, verdict, prepared, selected=True), prepared


def dispatch(
    weight: RankWeight,
    catalog: Catalog,
    *,
    activation_dtype: ActivationDtype,
    phase: Phase,
    device: Device | None = None,
    policy: FallbackPolicy | None = None,
    required: Sequence[str] = (),
    preferred: Sequence[str] = (),
    reuse: Mapping[str, PreparedLinear] | None = None,
) -> tuple[PreparedLinear, DispatchTrace]:
    """Select and prepare the kernel for one rank's weight in one phase; return it and the trace.

    ``reuse``: operators already prepared for this weight (by kernel ``id@version``, e.g. for the other
    phase); a candidate found there is not prepared again.
    """
    policy = policy or FallbackPolicy()
    op = operator_signature(weight, activation_dtype, phase, device or this_cpu())
    outcomes: list[Candidate] = []
    chosen: PreparedLinear | None = None
    chosen_name = ""
    notes: list[str] = []
    for kernel in ordered(catalog, activation_dtype, preferred):
        cap = kernel.capability
        name = f"{cap.id}@{cap.version}"
        slow = _slow_note(kernel, activation_dtype, preferred)
        verdict = admit(op, cap)
        if required and not named(kernel, required):
            verdict = _refused(name, verdict, Reason.NOT_REQUIRED, f"one of {list(required)}", cap.id)
        if not verdict.accepted or chosen is not None:
            outcomes.append(_candidate(name, verdict).model_copy(update={"note": slow}))
            continue
        candidate, prepared = _try(kernel, name, verdict, weight, op, policy, reuse)
        outcomes.append(candidate.model_copy(update={"note": slow}))
        if prepared is None:
            continue
        if policy.mode(prepared.transformation) == "warn":
            note = f"{weight.where} ({phase}): {name} runs as {prepared.transformation}"
            notes.append(note)
            warnings.warn(note, FallbackWarning, stacklevel=2)
        if slow is not None:
            why = "the manifest prefers it" if named(kernel, preferred) else "no fast path was selectable"
            notes.append(f"{weight.where} ({phase}): {name} runs its slow path for {activation_dtype}: {why}")
        chosen, chosen_name = prepared, name
    if chosen is None:
        only_policy = any(
            c.admission.reasons and all(r == Reason.POLICY for r in c.admission.reasons) for c in outcomes
        )
        error = FallbackForbiddenError if only_policy else NoAdmissibleKernelError
        raise error(
            weight.where,
            f"an admissible kernel for {phase} ({op.layout}, {activation_dtype} on {op.device})",
            "one candidate accepted under the policy",
            _listing(outcomes),
            "allow the fallback (--fallback allow) or publish the weight in a representation a kernel takes",
        )
    trace = DispatchTrace(
        weight=weight.where,
        phase=phase,
        requested=op,
        policy=policy,
        required=tuple(required),
        preferred=tuple(preferred),
        candidates=tuple(outcomes),
        selected=chosen_name,
        transformation=chosen.transformation,
        conversion_error=chosen.conversion_error,
        warnings=tuple(notes),
    )
    return chosen, trace


def dispatch_phases(
    weight: RankWeight,
    catalog: Catalog,
    *,
    activation_dtype: ActivationDtype,
    phases: Sequence[Phase] = ("prefill", "decode"),
    device: Device | None = None,
    policy: FallbackPolicy | None = None,
    required: Sequence[str] = (),
    preferred: Sequence[str] = (),
) -> dict[Phase, tuple[PreparedLinear, DispatchTrace]]:
    """Dispatch each phase (they may select different kernels); one prepared operator per kernel."""
    out: dict[Phase, tuple[PreparedLinear, DispatchTrace]] = {}
    done: dict[str, PreparedLinear] = {}
    for phase in phases:
        prepared, trace = dispatch(
            weight,
            catalog,
            activation_dtype=activation_dtype,
            phase=phase,
            device=device,
            policy=policy,
            required=required,
            preferred=preferred,
            reuse=done,
        )
        done[prepared.kernel] = prepared
        out[phase] = (prepared, trace)
    return out
