"""``registry up``: bring a pinned, verified model up on ranks, prove it, store signed evidence.

The driver (this module) first makes every check it can make alone, before anything starts
(:func:`admit`: the request's flags, the signing key evidence needs, the reference resolved once to a
manifest digest — a tag never moves under a running bring-up: every rank loads ``NAME@sha256:…`` —
then the sizes against that manifest (:mod:`.bounds`: world size against heads and rows, prompt and
generated tokens against the context, token ids against the vocabulary, a text prompt's bytes before it
is tokenized) and the required kernels against the catalog). It then checks the inventory against the
architecture strictly, builds the placement plan (refusing a topology the graph cannot run), and hands
one :class:`~.rank.RankSpec` per rank to a launcher: Ray
actors in a placement group (:mod:`.ray_ranks`), or the one rank in-process; a lost rank relaunches
the whole launch up to ``UpRequest.retries`` times (:func:`launch_with_retries`). A launcher that can
start before the specs exist (:class:`StartingLauncher`, as the Ray one does: join or start the cluster,
place the actors, let them import torch) is started after :func:`admit`, while the driver plans
(:func:`start_while_planning`); a plan that fails tears the started ranks down and raises its error.
It builds the float32 reference from the registry's reference decode of every weight, compares (L4),
checks dispatch and resources (L5), signs and stores the evidence, and writes the logits and the HTML
report on request.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from shardport.registry.artifact.refs import parse_ref
from shardport.registry.errors import UsageError
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved, resolve

from .errors import DeployError, UnsupportedModelError
from .launch import (
    Launcher,
    Progress,
    RayLauncher,
    StartingLauncher,
    launch_with_retries,
    start_while_planning,
)
from .rank import RankSpec

Activations = Literal["auto", "float32", "bfloat16"]
"""``--activations``: the choices the driver accepts (each rank checks its own with
:func:`.rank_ops.activations_of`; the driver does not import that module, which imports torch)."""


@dataclass(frozen=True)
class UpRequest:
    """What ``registry up`` was asked."""

    ref: str
    tokens: tuple[int, ...]
    steps: int = 4
    tp: int = 1
    ep: int = 1
    pp: int = 1
    fallback: Literal["forbid", "warn", "allow"] = "warn"
    store: str | None = None
    s3_endpoint: str | None = None
    address: str | None = None
    ladder: Literal["full", "sample", "off"] | bool = "sample"
    """The parity ladder's budget on every rank (see :mod:`.ladder_budget`; True/False: full/off)."""
    prompt: str | None = None
    """Text, encoded with the checkpoint's tokenizer (verified against the digest recorded at push)."""
    retries: int = 0
    """Relaunches after a lost rank (actor died, node gone); never after a rank's failure."""
    activations: Activations = "auto"
    """The quantized operators' activation dtype (``--activations``; float32: parity first, bfloat16:
    the CPU int4pack fast path, auto: float32 on CPU ranks and bfloat16 on CUDA ranks); norms, rotary,
    softmax, residual stream and KV cache stay float32."""
    trust: str | None = None
    """``--trust``: the trust policy or public key the driver resolved with (an absolute path); every rank
    resolves the pinned reference again with the same policy."""
    allow_unsigned: bool = False
    """``--allow-unsigned``: passed on to every rank's session."""
    stage_timeout: float | None = None
    """``--stage-timeout``: seconds to wait for the ranks at each stage (None: scaled to the model,
    :mod:`.stage_budget`)."""
    connect_timeout: float = 30.0
    """``--connect-timeout``: seconds joining ``--address`` may take (:func:`.cluster.probe`)."""
    verbose: bool = False
    """``--verbose``: Ray's own log lines on stderr (kept off it by default)."""


@dataclass(frozen=True)
class UpResult:
    """A finished bring-up: the digest it ran, what it generated, its evidence and where it is stored."""

    digest: str
    repository: str
    generated: tuple[int, ...]
    prompt_logits: np.ndarray
    predicate: dict[str, Any]
    evidence: str | None
    reports: list[dict[str, Any]] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        p = self.predicate
        return {
            "digest": self.digest,
            "repository": self.repository,
            "tag": p["tag"],
            "topology": p["topology"],
            "runtime": p.get("runtime"),
            "generated": list(self.generated),
            "passed": p["passed"],
            "parity": p["parity"],
            "ladder": p.get("ladder"),
            "dispatch": p["dispatch"],
            "timeline": p["timeline"],
            "ledger": p["ledger"],
            "memory": p["memory"],
            "read_amplification": p["read_amplification"],
            "devices": p.get("devices", {}),
            "attempts": p.get("attempts", []),
            "placement": p.get("placement"),
            "reference": p.get("reference"),
            "dispatch_candidates": p.get("dispatch_candidates", []),
            "ladder_values": p.get("ladder_values"),
            "evidence": self.evidence,
        }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("shardport", "torch", "ray", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    from shardport.kernels import default_catalog

    out["kernels"] = ",".join(f"{k.capability.id}@{k.capability.version}" for k in default_catalog())
    return out


def check_plan(resolved: Resolved, request: UpRequest) -> Any:
    """The graph contract, inventory and placement checks, at plan time; returns the contract."""
    return _check_plan(resolved, request)[0]


def _check_plan(resolved: Resolved, request: UpRequest) -> tuple[Any, Any]:
    """:func:`check_plan`, returning (the contract, the placement plan).

    The sizes (:func:`.bounds.check_world`, :func:`.bounds.check_sequence`) are checked again here for a
    caller that did not :func:`admit` first; they are cheap, and bound the planner's work.
    """
    from shardport.placement import Topology, plan

    from .bounds import check_sequence, check_world, context_length
    from .contract import check_inventory, contract_of
    from .plan_layout import layout_from_plan

    contract = contract_of(resolved.manifest)
    check_world(contract, request.tp, request.ep, request.pp)
    check_sequence(request.tokens, request.steps, contract, context_length(resolved.manifest))
    check_inventory(contract, resolved.manifest)
    topology = Topology(tp=request.tp, ep=request.ep, pp=request.pp)
    planned = plan(resolved.manifest, topology)
    for tp_rank in range(request.tp):
        layout_from_plan(planned, contract, tp_rank)
    return contract, planned


def plan_digests(planned: Any) -> dict[str, str]:
    """The placement plan's digests for the evidence: its canonical JSON's sha256, and its decisions'.

    The decisions' digest is the one every rank computes from its own plan (``plan_digest``).
    """
    from shardport.registry.artifact.hashing import digest_bytes

    return {
        "plan_sha256": str(digest_bytes(planned.to_json().encode())),
        "decisions": str(planned.decisions_digest()),
    }


def check_kernels(required: Sequence[str]) -> None:
    """Refuse ``runtime.kernels_required`` naming no kernel of this shardport's catalog.

    No rank could run a quantized weight; ids the catalog lacks next to one it has are left to dispatch.
    """
    from shardport.kernels.catalog import CATALOG_IDS

    if not required:
        return
    known = {*CATALOG_IDS, *(k.split("@")[0] for k in CATALOG_IDS)}
    if not any(r in known for r in required):
        raise UnsupportedModelError(
            f"runtime.kernels_required {list(required)}: names no kernel this shardport has "
            f"({', '.join(CATALOG_IDS)}); no rank could run its quantized weights. Push the checkpoint "
            "again with --kernels-required naming kernels of this version, or upgrade shardport"
        )


def reference_generation(
    session: Session, resolved: Resolved, contract: Any, prompt: Sequence[int], tokens: Sequence[int]
) -> tuple[Any, dict[str, str]]:
    """The float32 reference of a run that generated ``tokens``, and what computed it.

    Every weight decoded by the registry's reference decoder, one layer at a time, run by transformers'
    own decoder layers (the graph's own where transformers is absent: :mod:`.reference_stream`),
    teacher-forced on the run's ``tokens``: the reference's argmax at each decode position, and its
    logits there.
    """
    from .reference_stream import driver_reference

    return driver_reference(session, resolved, contract, prompt, tokens)


def _modes(request: UpRequest) -> tuple[str, str]:
    """The request's ladder mode and activations, checked (:class:`UsageError` naming the choices)."""
    from .ladder_budget import ladder_mode

    try:
        ladder = ladder_mode(request.ladder)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    choices = get_args(Activations)
    if request.activations not in choices:
        raise UsageError(f"--activations {request.activations!r}: expected one of {', '.join(choices)}")
    return ladder, request.activations


def check_request(request: UpRequest) -> None:
    """What the request alone can get wrong (before anything starts).

    The reference's form, retries, steps, degrees, modes.
    """
    parse_ref(request.ref)  # a malformed REF: its UsageError
    if request.retries < 0:
        raise UsageError(f"--retries {request.retries}: expected 0 or more")
    if request.steps < 1:
        raise UsageError(f"--generate {request.steps}: expected at least 1")
    for flag, degree in (("--tp", request.tp), ("--ep", request.ep), ("--pp", request.pp)):
        if degree < 1:  # before a cluster starts for a world of zero (or negative) ranks
            raise UsageError(f"{flag} {degree}: expected at least 1")
    _modes(request)


def specs_for(request: UpRequest, pinned: str, cpus: float, model_bytes: int = 0) -> list[RankSpec]:
    """One spec per rank; threads = the rank's share of the cores."""
    world = request.tp * request.ep * request.pp
    threads = max(1, int((cpus or os.cpu_count() or 1) // world))
    ladder, activations = _modes(request)
    return [
        RankSpec(
            ref=pinned,
            store=request.store,
            home=os.environ.get("SHARDPORT_HOME"),
            s3_endpoint=request.s3_endpoint,
            tp=request.tp,
            ep=request.ep,
            pp=request.pp,
            rank=rank,
            fallback=request.fallback,
            prompt=request.tokens,
            steps=request.steps,
            threads=threads,
            ladder=ladder,
            activations=activations,
            trust=request.trust,
            allow_unsigned=request.allow_unsigned,
            model_bytes=model_bytes,
        )
        for rank in range(world)
    ]


def ray_launcher(
    address: str | None, progress: Progress | None = None, request: UpRequest | None = None
) -> RayLauncher:
    """Run the ranks as Ray actors (:class:`RayLauncher`), with ``request``'s timeouts and verbosity."""
    if request is None:
        return RayLauncher(address, progress)
    return RayLauncher(address, progress, request.stage_timeout, request.connect_timeout, request.verbose)


def _tag_of(resolved: Resolved) -> dict[str, Any] | None:
    """The tag version the reference resolved (None for ``NAME@sha256:…``)."""
    if resolved.tag_entry is None:
        return None
    doc = resolved.tag_entry.doc
    return {
        "name": doc.tag,
        "version": doc.version,
        "digest": doc.target,
        "rollback_of": None if doc.rollback_of is None else doc.rollback_of.version,
    }


def _check(
    session: Session, resolved: Resolved, contract: Any, request: UpRequest, reports: list[dict[str, Any]]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """L4 against the float32 reference and L5 over the ranks' reports: (the run, parity, L5)."""
    import torch

    from .graph.model import Generation
    from .graph.reference import compare
    from .pinned_kernels import check_pins
    from .rank_ops import policy_of
    from .up_evidence import tolerance
    from .up_l5 import level5

    reporter = next((r for r in reports if r.get("prompt_logits") is not None), None)
    if reporter is None:
        raise DeployError("no rank reported logits (the last pipeline stage's first rank must)")
    run = Generation(
        torch.from_numpy(np.array(reporter["prompt_logits"])),
        tuple(reporter["tokens"]),
        torch.from_numpy(np.array(reporter["token_logits"])),
    )
    reference, source = reference_generation(session, resolved, contract, request.tokens, run.tokens)
    tol = tolerance(reports, contract.layers, float(reference.prompt_logits.abs().max()))
    parity = compare(run, reference, tol["value"], source).model_dump(mode="json")
    parity["tolerance_derivation"] = tol
    # L5 against the pinned manifest's kernels (push pinned them), not dispatch's order run again
    pins = check_pins(resolved.manifest, reports)
    l5 = level5(reports, policy_of(request.fallback), pins)
    return run, parity, l5


@dataclass(frozen=True)
class Admitted:
    """A request the driver admitted (:func:`admit`).

    The pinned manifest, the request with its text prompt encoded, the graph contract and the tokenizer
    (None for ``--tokens``).
    """

    resolved: Resolved
    request: UpRequest
    contract: Any
    tokenizer: Any
    resolve_s: float
    admit_s: float
    placed: Any = None
    """The placement plan, where admission made it (the embedded default: :func:`.runnable.check_slices`)."""


def admit(session: Session, request: UpRequest, *, store_evidence: bool = False) -> Admitted:
    """Every check the driver can make alone, before anything starts (no cluster, no rank, no torch).

    The request's flags (:func:`check_request`: the reference's form among them); the signing key, when
    the evidence is to be stored; then the reference resolved once to a digest (~0.1 s) and the sizes
    against its manifest (:mod:`.bounds`): world size against heads, kv heads, rows, experts and layers;
    a text prompt's bytes against the context before it is tokenized; the prompt's token ids against the
    vocabulary and prompt + generated tokens against the context; ``runtime.kernels_required`` against
    the kernel catalog (:func:`check_kernels`); on the embedded default (the ranks' device class known
    here), the pinned kernels (:func:`.runnable.check_runnable`), then the placement plan and every
    rank's weight slices admitted from the manifest alone (:func:`.runnable.check_slices`; the plan is
    kept for the launch).
    """
    from .bounds import check_prompt_bytes, check_sequence, check_world, context_length
    from .contract import contract_of
    from .runnable import check_runnable, check_slices, embedded_device_class, host_has_gpu
    from .topology_check import check_degrees

    check_request(request)
    if store_evidence and session.key is None:
        raise UsageError(
            "registry up stores signed evidence and needs a signing key: pass --key or run "
            "`registry keygen` (or --no-evidence to store none)"
        )
    t0 = time.perf_counter()
    resolved = resolve(session, parse_ref(request.ref))
    resolve_s = time.perf_counter() - t0
    contract = contract_of(resolved.manifest)
    context = context_length(resolved.manifest)
    check_world(contract, request.tp, request.ep, request.pp)
    check_degrees(resolved.manifest, request.tp, request.ep, request.pp)  # the topology layer
    tokenizer = None
    if request.prompt is not None:
        from .tokenizer import load_tokenizer, read_tokenizer

        check_prompt_bytes(request.prompt, context)
        tokenizer = load_tokenizer(resolved.manifest, read_tokenizer(session.store, resolved.manifest))
        request = dataclasses.replace(request, tokens=tuple(tokenizer.encode(request.prompt)))
    check_sequence(request.tokens, request.steps, contract, context)
    check_kernels(tuple(resolved.manifest.runtime.kernels_required))
    placed = None
    if request.address in (None, "local"):  # the embedded default: the ranks' device class is known here
        device_class = embedded_device_class(request.activations, gpu=host_has_gpu())
        check_runnable(resolved.manifest, device_class, request.fallback)
        placed = _check_plan(resolved, request)[1] if device_class is not None else None
        check_slices(resolved.manifest, placed, device_class, request.fallback)  # every rank's slices
    admit_s = time.perf_counter() - t0 - resolve_s
    return Admitted(resolved, request, contract, tokenizer, resolve_s, admit_s, placed)


@dataclass(frozen=True)
class _Planned:
    """The driver's plan: the pinned manifest, the request (tokens encoded), contract and rank specs."""

    resolved: Resolved
    request: UpRequest
    contract: Any
    tokenizer: Any
    specs: list[RankSpec]
    resolve_s: float
    plan_s: float
    plan: dict[str, str] = field(default_factory=dict)
    """The placement plan's digests (:func:`plan_digests`)."""


def _plan_admitted(admitted: Admitted) -> _Planned:
    """Inventory and placement of an admitted request (:func:`check_plan`); the rank specs."""
    t0 = time.perf_counter()
    resolved, request = admitted.resolved, admitted.request
    contract, placed = (
        (admitted.contract, admitted.placed)
        if admitted.placed is not None
        else _check_plan(resolved, request)
    )
    pinned = f"{resolved.ref.name}@{resolved.digest}"
    model_bytes = sum(f.size for f in resolved.manifest.files)
    specs = specs_for(request, pinned, float(os.cpu_count() or 1), model_bytes)
    plan_s = admitted.admit_s + time.perf_counter() - t0
    return _Planned(
        resolved,
        request,
        contract,
        admitted.tokenizer,
        specs,
        admitted.resolve_s,
        plan_s,
        plan_digests(placed),
    )


def _plan(session: Session, request: UpRequest) -> _Planned:
    """:func:`admit` and plan in one call (resolve once, encode, check sizes, inventory, placement)."""
    return _plan_admitted(admit(session, request))


def _launch_seconds(report: dict[str, Any], wall0: float, counted: float) -> dict[str, float]:
    """``launch``: from the bring-up's start to the rank's first stage, less the driver's resolve and plan.

    Those are listed as such (they overlap the launch when the launcher starts early). From the rank's
    wall clock (``clock.resolve``, its first stage; across hosts as good as their clocks agree); none
    without one.
    """
    clock = report.get("clock", {})
    began = clock.get("resolve", clock.get("prepare"))
    if began is None:
        return {}
    return {"launch": max(0.0, float(began) - wall0 - counted)}


def _plan_and_launch(
    admitted: Admitted, launch: Launcher, progress: Progress | None
) -> tuple[_Planned, list[dict[str, Any]], list[dict[str, Any]]]:
    """Plan, and launch with retries; a :class:`StartingLauncher` is started while the driver plans."""
    request = admitted.request

    def planning() -> _Planned:
        return _plan_admitted(admitted)

    if not isinstance(launch, StartingLauncher):
        planned = planning()
        return planned, *launch_with_retries(launch, planned.specs, request.retries, progress)
    from shardport.placement import Topology

    topology = Topology(tp=request.tp, ep=request.ep, pp=request.pp)
    planned, started = start_while_planning(launch, topology, planning)
    pending: list[Launcher] = [started.launch]

    def launch_once(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        # the started ranks first; after a lost rank, a fresh start
        return (pending.pop() if pending else launch)(specs)

    try:
        return planned, *launch_with_retries(launch_once, planned.specs, request.retries, progress)
    finally:
        started.close()


def bring_up(
    session: Session,
    request: UpRequest,
    *,
    launcher: Launcher | None = None,
    store_evidence: bool = True,
    progress: Callable[[int, str], None] | None = None,
) -> UpResult:
    """Run the whole bring-up (see the module docstring); raises a typed error on any failure.

    Nothing starts before :func:`admit` passed (a refused request costs a resolve, never a cluster).
    """
    wall0 = time.time()
    admitted = admit(session, request, store_evidence=store_evidence)
    launch = launcher or ray_launcher(request.address, progress, request)
    planned, reports, attempts = _plan_and_launch(admitted, launch, progress)
    resolved, request, contract, tokenizer = (
        planned.resolved,
        planned.request,
        planned.contract,
        planned.tokenizer,
    )
    for r in reports:  # the driver's resolve and plan are part of every rank's startup
        r["timeline"] = {
            "resolve": planned.resolve_s + r["timeline"].get("resolve", 0.0),
            "plan": planned.plan_s + r["timeline"].get("plan", 0.0),
            **_launch_seconds(r, wall0, planned.resolve_s + planned.plan_s),
            **{k: v for k, v in r["timeline"].items() if k not in ("resolve", "plan")},
        }
    from .quant_error import quant_error_row
    from .rank_report import check_reports
    from .up_evidence import predicate

    check_reports(reports)  # a malformed report fails here, by rank and field
    run, parity, l5 = _check(session, resolved, contract, request, reports)
    pred = predicate(
        repository=resolved.ref.name,
        digest=resolved.digest,
        tag=_tag_of(resolved),
        topology={"tp": request.tp, "ep": request.ep, "pp": request.pp},
        reports=reports,
        parity=parity,
        l5=l5,
        versions=_versions(),
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        prompt=request.tokens,
        generated=run.tokens,
        activations=request.activations,
        plan=planned.plan,
        extra_rows=[quant_error_row(resolved.manifest)],
    )
    pred["attempts"] = attempts
    if tokenizer is not None:
        pred["tokenizer"] = {"source": tokenizer.source, "digest": str(tokenizer.digest)}
        pred["text"] = {"prompt": request.prompt, "generated": tokenizer.decode(run.tokens)}
    pred, stored = _sign(session, resolved, reports, pred, store_evidence)
    return UpResult(
        digest=resolved.digest,
        repository=resolved.ref.name,
        generated=run.tokens,
        prompt_logits=run.prompt_logits.numpy(),
        predicate=pred,
        evidence=stored,
        reports=reports,
    )


def _sign(
    session: Session, resolved: Resolved, reports: list[dict[str, Any]], pred: dict[str, Any], store: bool
) -> tuple[dict[str, Any], str | None]:
    """Seal and finish what was added to ``pred``; store the ladder values, then the evidence naming them.

    Returns the final predicate and the evidence blob (None when not stored).
    """
    from shardport.registry import evidence as registry_evidence

    from .up_content import ladder_values
    from .up_finite import seal
    from .up_rows import finish

    pred = finish(seal(pred), {})  # what was added since: a NaN is text and fails, never unsignable
    if not store:
        return pred, None
    name, digest = resolved.ref.name, resolved.digest
    values = ladder_values(reports)
    blob = registry_evidence.store_attachment(session, name, digest, values)
    pred["ladder_values"] = {**pred["ladder_values"], "blob": blob}
    return pred, registry_evidence.store_evidence(session, name, digest, pred)


def write_logits(path: Path, logits: np.ndarray) -> Path:
    """``--logits-out``: float32 ``logits`` ``[T, vocab]`` as safetensors, written atomically.

    A temporary file in the same folder (created ``O_EXCL | O_NOFOLLOW``), read back and compared,
    flushed to disk, renamed over ``path``; removed on any failure. ``path`` must be a new name or a
    regular file (:func:`~shardport.registry.output.destination.file_destination`, checked before the
    bring-up).
    """
    from shardport.registry.output.writers import write_safetensors

    write_safetensors({"logits": np.asarray(logits, dtype=np.float32)}, path, durable=True)
    return path
