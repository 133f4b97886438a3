"""The evidence of one bring-up, as plain data: parity L4 (graph) and L5 (dispatch and resources).

Pure: the ranks' reports, the reference generation and the policy in; the evidence predicate out
(``https://shardport.dev/evidence/v1``; the fields :mod:`.report` draws, plus the details). No Ray,
no store. Every number is a finite float or an int (the statement is canonical JSON): a measured NaN
or infinity is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and fails its row
and the row "every measured value finite" (:mod:`.up_finite`): the evidence is signed, and fails.

- L4: the parallel logits against the single-process float32 reference built from the registry's
  reference decode of every weight — max |Δ| over the prompt positions, top-1 agreement per position,
  identical greedy tokens for K steps, and each rank's KV-cache check (decode steps vs one fresh
  prefill of the whole sequence). A position or step whose logits are non-finite or all equal
  (all zero, all NaN) fails top-1 and greedy: an argmax there proves nothing.
  The tolerance is derived from the admitted kernels' recorded L3 errors (see :func:`tolerance`).
- L0-L3: the ranks' ladder records under the budget (``--ladder``, :mod:`.ladder_budget`): a
  ``sampled`` record (L0, L1, the witness rows) counts as proved only together with its class
  representative's full ladder on the same rank (:func:`ladder_coverage`); under ``off`` the rows say
  "not run" (``passed`` None) and the overall ``passed`` covers the levels that ran.
- L5: every trace's selected kernel is the one the driver expects for that operator (admission
  recomputed here, in dispatch's order for the operator's activation dtype, under the policy);
  fallback counts per class within the policy; no persistent full-dequant buffer unless the policy
  allows one; no loaded plane kept that no operator uses (:mod:`.release`); each rank's resident
  growth within its component ledger; on a CUDA rank, the device memory torch allocated against the
  prepared operators' bytes (:func:`device_check`; a CPU rank has no device memory and says so).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .ladder_rows import capped_error, l1_row, l2_row, l3_row
from .up_finite import finite_row, seal, within, worst
from .up_l5 import (  # noqa: F401 - re-exported: L5 moved to .up_l5
    DEVICE_COMPONENTS,
    DEVICE_SLACK,
    LEDGER_COMPONENTS,
    RESIDENT_SLACK,
    components,
    device_check,
    expected_kernel,
    kernel_path,
    l5_rows,
    level5,
)


@dataclass(frozen=True)
class L4Budget:
    """The L4 tolerance's terms for one activation dtype of the operators (:func:`tolerance`)."""

    amplification: float
    e_floor: float
    """The least operator error assumed (relative), whatever L3 recorded (or when no ladder ran)."""
    blocks: Literal["linear", "quadrature"]
    """How the ``layers + 1`` blocks' errors add up: ``layers + 1`` times, or ``sqrt(layers + 1)``."""

    def growth(self, layers: int) -> float:
        """The blocks' factor."""
        return float(layers + 1) if self.blocks == "linear" else math.sqrt(layers + 1)


#: Per activation dtype of the operators. float32 (unchanged): E_kernel is ~1e-7 (floored at 1e-6) and
#: 64 covers the tensor-parallel sums' different order and the attention softmax's amplification, each
#: block adding it in full. bfloat16: every operator rounds its input and output to bfloat16, so E is
#: never taken below the dtype's unit roundoff 2^-8 (L3 records 2-3e-3: output rounding and bf16
#: scales; it does not see the input rounding, its golden batches being bfloat16 already); the blocks'
#: roundings are independent and add in quadrature (added in full they would pass the logits' own
#: scale beyond ~30 layers: vacuous); 16 covers the input rounding and the softmax. Measured: 2-layer
#: test models, tp 1-2, max |Δ| 1-2 % of the logit scale, tolerance 11 % of it (5-9x); the 4-layer
#: quick bench 0.06 %, tolerance 14 %.
L4_BUDGETS: dict[str, L4Budget] = {
    "float32": L4Budget(64.0, 1e-6, "linear"),
    "bfloat16": L4Budget(16.0, 2.0**-8, "quadrature"),
}


def activations_run(reports: Sequence[Mapping[str, Any]]) -> str:
    """The activation dtype the operators ran in: bfloat16 when any did (the coarser), else float32."""
    dtypes = {str(t["requested"]["activation_dtype"]) for r in reports for t in r.get("dispatch", [])}
    return "bfloat16" if "bfloat16" in dtypes else "float32"


def runtime_section(requested: str, reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the operators ran in: the activation dtype asked, traces per admitted dtype, the exceptions.

    ``requested``: ``--activations`` (``auto``: each rank's report says what its device resolved it to,
    ``ranks``); each operator admitted with another dtype than its rank's (float32: the output head, or
    a kernel that does not take the dtype) is listed with its trace's note
    (:func:`.rank_ops.prepare_ops` never runs an operator in another dtype silently).
    """
    counts: Counter[str] = Counter()
    other: dict[tuple[int, str], str] = {}  # one line per rank and weight (its phases say the same)
    ranks: dict[str, str] = {}
    for r in sorted(reports, key=lambda r: int(r["rank"])):
        mine = str(r.get("activations", requested))
        ranks[str(r["rank"])] = mine
        for t in r.get("dispatch", []):
            dtype = str(t["requested"]["activation_dtype"])
            counts[dtype] += 1
            if dtype != mine:
                notes = [w for w in t.get("warnings", []) if "activations" in w]
                line = f"rank {r['rank']} " + (notes[0] if notes else f"{t['weight']}: {dtype}")
                other.setdefault((int(r["rank"]), str(t["weight"])), line)
    return {
        "activations": requested,
        "ranks": ranks,
        "operators": dict(sorted(counts.items())),
        "float32": list(other.values()),
    }


def tolerance(reports: Sequence[Mapping[str, Any]], layers: int, logit_scale: float) -> dict[str, Any]:
    """The L4 tolerance: ``A · max(E_kernel, floor) · growth(layers) · max(1, max|logit|)``.

    ``E_kernel``: the largest relative operator error any admitted kernel showed at L3 (float32
    accumulation in a different order, a conversion's rounding; under ``--ladder sample`` measured on
    each class's representative, under ``off`` none), each batch's capped at its own L3 tolerance
    (the kernel's accumulation tolerance plus the bound its conversion budget allows, both independent
    of what was measured): a kernel that fails L3 fails there, it does not widen L4; a conversion's
    measured error (``e_conversion``) is not a term. Each of the ``layers + 1`` blocks can add it,
    relative to the logits' scale. ``A``, ``floor`` and ``growth`` follow the operators' activation
    dtype (:data:`L4_BUDGETS`): float32 ``64 · max(E, 1e-6) · (layers + 1)``, bfloat16
    ``16 · max(E, 2^-8) · sqrt(layers + 1)``.
    """
    e_max = worst(capped_error(x) for r in reports for lad in r.get("ladders", []) for x in lad["l3"])
    dtype = activations_run(reports)
    budget = L4_BUDGETS[dtype]
    # a NaN anywhere stays NaN (max() would drop it): the tolerance is then NaN and L4 fails, sealed
    value = (
        budget.amplification
        * worst([e_max, budget.e_floor])
        * budget.growth(layers)
        * worst([1.0, float(logit_scale)])
    )
    return {
        "e_kernel_max": e_max,
        "logit_scale": float(logit_scale),
        "value": value,
        "activations": dtype,
        "amplification": budget.amplification,
        "e_floor": budget.e_floor,
        "blocks": budget.blocks,
    }


def _is_full(lad: Mapping[str, Any]) -> bool:
    """A full-ladder record (records written before the budget have no ``scope``: full)."""
    return bool(lad.get("scope", "full") == "full")


def _not_run(mode: str) -> list[dict[str, Any]]:
    """The L0-L3 rows of a bring-up that ran no ladder: passed is None, not True."""
    names = {
        "L0": "bytes from verified tiles of the pinned manifest",
        "L1": "codes preserved by every layout",
        "L2": "layout decode = reference decode; witness rows",
        "L3": "operator error vs reference (max E_kernel)",
    }
    return [
        {
            "level": level,
            "name": name,
            "passed": None,
            "status": "not run",
            "value": None,
            "tolerance": None,
            "detail": f"not run (--ladder {mode})",
        }
        for level, name in names.items()
    ]


def ladder_coverage(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which operators ran the full ladder and which were covered by which representative, per rank.

    ``classes``: per rank and ladder class, the representative (its full ladder) and the weights it
    covers; ``uncovered``: dispatched operators without any ladder record; ``orphans``: sampled ladders
    whose representative's full ladder is missing or of another class; ``failed_representatives``:
    representatives whose full ladder did not pass (every weight they cover counts as unproved).
    """
    modes = sorted({str(r.get("ladder_mode", "full" if r.get("ladders") else "off")) for r in reports})
    classes: list[dict[str, Any]] = []
    orphans: list[str] = []
    failed: list[str] = []
    uncovered: list[str] = []
    full = sampled = 0
    for r in sorted(reports, key=lambda r: int(r["rank"])):
        ladders = list(r.get("ladders", []))
        by_key = {(lad["weight"], lad["kernel"]): lad for lad in ladders if _is_full(lad)}
        groups: dict[tuple[str, str], list[str]] = {}
        for lad in ladders:
            if _is_full(lad):
                full += 1
                groups.setdefault((lad["weight"], lad["kernel"]), [])
                continue
            sampled += 1
            rep = by_key.get((lad.get("represented_by"), lad["kernel"]))
            if rep is None or rep.get("ladder_class") != lad.get("ladder_class"):
                orphans.append(
                    f"rank {r['rank']} {lad['weight']} ({lad['kernel']}): {lad.get('represented_by')}"
                )
                continue
            groups[(rep["weight"], rep["kernel"])].append(lad["weight"])
        for (weight, kernel), covered in groups.items():
            rep = by_key[(weight, kernel)]
            if not _ladder_passed(rep):
                failed.append(f"rank {r['rank']} {weight} ({kernel})")
            classes.append(
                {
                    "rank": r["rank"],
                    "kernel": kernel,
                    "ladder_class": rep.get("ladder_class"),
                    "representative": weight,
                    "represents": len(covered),
                    "covered": covered,
                }
            )
        if ladders or r.get("ladder_mode", "full") != "off":
            laddered = {(lad["weight"], lad["kernel"]) for lad in ladders}
            uncovered += sorted(
                {
                    f"rank {r['rank']} {t['weight']} ({t['selected']})"
                    for t in r.get("dispatch", [])
                    if (t["weight"], t["selected"]) not in laddered
                }
            )
    return {
        "mode": modes[0] if len(modes) == 1 else ",".join(modes),
        "operators": full + sampled,
        "full": full,
        "sampled": sampled,
        "classes": classes,
        "uncovered": uncovered,
        "orphans": orphans,
        "failed_representatives": failed,
    }


def _ladder_passed(lad: Mapping[str, Any]) -> bool:
    levels = (lad["l0"], lad["l1"], lad["l2"], *lad["l3"])
    return all(bool(x["passed"]) for x in levels)


def _ladder_rows(
    reports: Sequence[Mapping[str, Any]], digest: str, coverage: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    coverage = ladder_coverage(reports) if coverage is None else coverage
    ladders = [lad for r in reports for lad in r["ladders"]]
    if not ladders and coverage["mode"] == "off":
        return _not_run("off")
    full = [lad for lad in ladders if _is_full(lad)]
    sampled = [lad for lad in ladders if not _is_full(lad)]
    tiles = sum(int(lad["l0"]["verified_tiles"]) for lad in ladders)
    covered = not coverage["orphans"] and not coverage["failed_representatives"]
    gaps = "; ".join(
        [f"no representative: {o}" for o in coverage["orphans"][:3]]
        + [f"representative failed: {f}" for f in coverage["failed_representatives"][:3]]
    )
    scope = f"full ladder on {len(full)} of {len(ladders)} operators" + (
        f" (one per class; {len(sampled)} covered by their class representative)" if sampled else ""
    )
    return [
        {
            "level": "L0",
            "name": "bytes from verified tiles of the pinned manifest",
            "passed": bool(ladders)
            and not coverage["uncovered"]
            and all(lad["l0"]["passed"] and lad["l0"]["manifest_digest"] == digest for lad in ladders),
            "value": tiles,
            "tolerance": None,
            "detail": f"{len(ladders)} operators, {tiles} verified tiles, manifest {digest}"
            + (f"; no ladder: {'; '.join(coverage['uncovered'][:3])}" if coverage["uncovered"] else ""),
        },
        l1_row(ladders),
        l2_row(ladders, full, scope, gaps, covered),
        l3_row(full, scope, gaps, covered),
    ]


def _graph_rows(
    reports: Sequence[Mapping[str, Any]], parity: Mapping[str, Any], l5: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The L4 and L5 rows of the parity table."""
    rows: list[dict[str, Any]] = []
    caches = [r["cache"] for r in reports]
    cache_ok = all(within(c["max_abs_diff"], c["tolerance"]) for c in caches)
    top1 = parity["top1_agree"]
    degenerate = list(parity.get("degenerate_positions", []))
    steps = list(parity.get("degenerate_steps", []))
    rows += [
        {
            "level": "L4",
            "name": "logits max |Δ| vs float32 reference",
            "passed": within(parity["max_abs_diff"], parity["tolerance"])
            and within(parity["decode_max_abs_diff"], parity["tolerance"]),
            "value": parity["max_abs_diff"],
            "tolerance": parity["tolerance"],
            "detail": f"{parity['positions']} positions; decode max |Δ| {parity['decode_max_abs_diff']:.3g}; "
            + "reference: "
            + ", ".join(map(str, (parity.get("reference") or {"kind": "not named"}).values())),
        },
        {
            "level": "L4",
            "name": "top-1 agreement per position",
            "passed": all(top1) and not degenerate,
            "value": sum(top1),
            "tolerance": len(top1),
            "detail": "".join("1" if x else "0" for x in top1)
            + (f"; degenerate logits (non-finite or all equal) at positions {degenerate}" * bool(degenerate)),
        },
        {
            "level": "L4",
            "name": "greedy tokens identical",
            "passed": list(parity["tokens"]) == list(parity["reference_tokens"]) and not steps,
            "value": len(parity["tokens"]),
            "tolerance": None,
            "detail": f"{list(parity['tokens'])} vs {list(parity['reference_tokens'])}"
            + (f"; degenerate logits (non-finite or all equal) at decode steps {steps}" * bool(steps)),
        },
        {
            "level": "L4",
            "name": "KV cache: decode steps = one fresh prefill",
            "passed": cache_ok,
            "value": worst(float(c["max_abs_diff"]) for c in caches),
            "tolerance": worst(float(c["tolerance"]) for c in caches),
            "detail": f"{len(caches)} ranks",
        },
    ]
    return rows + l5_rows(l5)


def predicate(
    *,
    repository: str,
    digest: str,
    tag: Mapping[str, Any] | None,
    topology: Mapping[str, int],
    reports: Sequence[Mapping[str, Any]],
    parity: Mapping[str, Any],
    l5: Mapping[str, Any],
    versions: Mapping[str, str],
    created: str,
    prompt: Sequence[int],
    generated: Sequence[int],
    activations: str = "float32",
    plan: Mapping[str, str] | None = None,
    extra_rows: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The evidence predicate (what is signed) and what ``--json`` / ``--report`` show.

    ``activations``: the dtype the bring-up asked its quantized operators to run in (the ``runtime``
    section records it beside what each operator was admitted with); ``plan``: the driver's placement
    plan digests (:func:`.up_content.placement`). Sealed (:func:`.up_finite.seal`): a NaN or infinity
    measured anywhere is written as text and fails the evidence; finished (:func:`.up_rows.finish`):
    every row has a status, a tolerance's source and a measured count, ``passed`` is every row that ran.
    ``extra_rows``: rows from the manifest alone (E_quant, :mod:`.quant_error`), after the ladder's.
    The ladders' per-weight values are named by digest (``ladder_values``), not embedded.
    """
    from .up_content import recorded
    from .up_rows import finish, measured_counts

    coverage = ladder_coverage(reports)
    rows = [*_ladder_rows(reports, digest, coverage), *map(dict, extra_rows)]
    rows += [*_graph_rows(reports, parity, l5), finite_row()]
    by_rank = sorted(reports, key=lambda r: int(r["rank"]))
    out = {
        "manifest": digest,
        "repository": repository,
        "tag": dict(tag) if tag else None,
        "topology": dict(topology),
        "runtime": runtime_section(activations, reports),
        "created": created,
        "versions": dict(versions),
        "prompt": list(prompt),
        "generated": list(generated),
        "passed": all(bool(r["passed"]) for r in rows if r.get("passed") is not None),
        "parity": rows,
        **recorded(reports, parity, plan),
        "ladder": coverage,
        "parity_l4": dict(parity),
        "l5": dict(l5),
        "dispatch": [
            {
                "rank": r["rank"],
                "weight": t["weight"],
                "phase": t["phase"],
                "kernel": t["selected"],
                "transformation": t["transformation"],
                "activations": t.get("requested", {}).get("activation_dtype"),
                "path": kernel_path(t),
            }
            for r in by_rank
            for t in r["dispatch"]
        ],
        "timeline": {str(r["rank"]): {k: float(v) for k, v in r["timeline"].items()} for r in by_rank},
        "ledger": {str(r["rank"]): components(r["ledger"]) for r in by_rank},
        "memory": {
            str(r["rank"]): {k: int(v) for k, v in r["ledger"].items() if k not in LEDGER_COMPONENTS}
            for r in by_rank
        },
        "devices": {str(r["rank"]): str(r.get("device", "cpu")) for r in by_rank},
        "gpus": {str(r["rank"]): [str(g) for g in r.get("gpu_ids", [])] for r in by_rank},
        "read_amplification": {str(r["rank"]): float(r["read_amplification"]) for r in by_rank},
        "tiles_verified": {str(r["rank"]): int(r["tiles_verified"]) for r in by_rank},
        "witness": {str(r["rank"]): r["witness"] for r in by_rank},
        "decode_seconds": {str(r["rank"]): float(r["decode_seconds"]) for r in by_rank},
    }
    return finish(seal(out), measured_counts(reports, parity))
