"""What the evidence records beside its verdict: dispatch's candidates, conversion errors, ladder values.

Pure: the ranks' reports in, plain data out. One trace per weight, rank and phase is too many to sign
in full (1,266 on the 1 GiB checkpoint at tp 4), so :func:`candidate_groups` keeps one entry per (rank,
weight class, phase): how many weights, which kernels were selected, and per candidate kernel whether
it admitted, was prepared and was selected, with every distinct refusal reason. :func:`conversion_errors`
keeps the largest recorded conversion error per (rank, weight class, kernel). The L0-L3 values of
every weight and rank (:func:`ladder_values`) can be large: the evidence names them by the sha256 of
their canonical JSON and the bring-up stores them as a signed attachment
(:func:`shardport.registry.evidence.store_attachment`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardport.kernels import OperatorSignature
from shardport.kernels.expectations import weight_class
from shardport.provenance.canonical import finite_text

from .node_ledger import node_ledger, tp_spans_nodes


def _class_of(trace: Mapping[str, Any]) -> str:
    return weight_class(OperatorSignature.model_validate(trace["requested"]))


def candidate_groups(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (rank, weight class, phase): weights, selected kernels and every candidate's outcome."""
    groups: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in sorted(reports, key=lambda r: int(r["rank"])):
        for t in r.get("dispatch", []):
            key = (int(r["rank"]), _class_of(t), str(t["phase"]))
            g = groups.setdefault(
                key,
                {
                    "rank": key[0],
                    "weight_class": key[1],
                    "phase": key[2],
                    "weights": 0,
                    "selected": {},
                    "activations": sorted({}),
                    "candidates": {},
                },
            )
            g["weights"] += 1
            g["selected"][t["selected"]] = g["selected"].get(t["selected"], 0) + 1
            dtype = str(t["requested"]["activation_dtype"])
            if dtype not in g["activations"]:
                g["activations"] = sorted([*g["activations"], dtype])
            for c in t.get("candidates", []):
                cand = g["candidates"].setdefault(
                    c["kernel"],
                    {"kernel": c["kernel"], "admitted": 0, "prepared": 0, "selected": 0, "reasons": []},
                )
                cand["admitted"] += bool(c["admission"]["accepted"])
                cand["prepared"] += bool(c.get("prepared"))
                cand["selected"] += bool(c.get("selected"))
                for refusal in c["admission"].get("refusals", []):
                    why = f"{refusal['reason']}: expected {refusal['expected']}, found {refusal['found']}"
                    if why not in cand["reasons"]:
                        cand["reasons"].append(why)
    return [{**g, "candidates": list(g["candidates"].values())} for _, g in sorted(groups.items())]


def conversion_errors(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The largest recorded conversion error per (rank, weight class, kernel) where one is recorded."""
    worst: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in reports:
        for t in r.get("dispatch", []):
            err = float(t.get("conversion_error", 0.0))
            if t.get("transformation") != "conversion" and err == 0.0:
                continue
            key = (int(r["rank"]), _class_of(t), str(t["selected"]))
            e = worst.setdefault(
                key, {"rank": key[0], "weight_class": key[1], "kernel": key[2], "traces": 0, "max": 0.0}
            )
            e["traces"] += 1
            e["max"] = err if err != err else max(float(e["max"]), err)  # a NaN stays (sealed later)
    return [worst[k] for k in sorted(worst)]


def ladder_values(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every ladder record of every rank, with its rank (the per-weight L0-L3 values).

    A non-finite number is written as text (:func:`~shardport.provenance.canonical.finite_text`), as in
    the predicate: the values can then be hashed and signed.
    """
    values = [
        {"rank": int(r["rank"]), **lad}
        for r in sorted(reports, key=lambda r: int(r["rank"]))
        for lad in r.get("ladders", [])
    ]
    out: list[dict[str, Any]] = finite_text(values)
    return out


def placement(driver_plan: Mapping[str, str] | None, reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The placement plan's digests (the driver's and each rank's: they must agree), and the nodes.

    ``nodes``: each node's ranks and its one read of their union (:func:`~.node_ledger.node_ledger`).
    """
    ranks = {str(r["rank"]): r.get("plan_digest") for r in sorted(reports, key=lambda r: int(r["rank"]))}
    decisions = (driver_plan or {}).get("decisions")
    return {
        **(driver_plan or {}),
        "ranks": ranks,
        "agree": decisions is not None and all(d == decisions for d in ranks.values()),
        "nodes": node_ledger(reports),
        "tp_spans_nodes": tp_spans_nodes(reports),
    }


def recorded(
    reports: Sequence[Mapping[str, Any]], parity: Mapping[str, Any], plan: Mapping[str, str] | None
) -> dict[str, Any]:
    """What the predicate records beside its rows.

    The L4 reference, the placement digests, dispatch's candidates, conversion errors, and the ladder
    values by digest (``blob``: None until the bring-up stores the attachment).
    """
    from shardport.registry.evidence import values_digest

    values = ladder_values(reports)
    return {
        "reference": parity.get("reference"),
        "placement": placement(plan, reports),
        "dispatch_candidates": candidate_groups(reports),
        "conversion_errors": conversion_errors(reports),
        "ladder_values": {"sha256": values_digest(values), "operators": len(values), "blob": None},
    }
