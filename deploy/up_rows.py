"""The parity rows made whole: a status, a tolerance's source and a measured count on every row.

:func:`finish` runs last on a predicate (after :func:`.up_finite.seal`): every row gets ``status``
(``pass``/``fail`` from its ``passed``; a row already ``not applicable`` or ``not run`` keeps it),
``tolerance_source`` (where its tolerance comes from: a policy, the manifest, a derivation; the
defaults of :data:`SOURCES` for the L0-L4 rows that do not say) and ``measured`` (how many quantities
it measured). A ``pass`` row that measured nothing (``measured`` 0 or missing) becomes ``not
applicable``, its detail saying so: a check that looked at nothing proves nothing, and never counts as
a pass (L1 on a model whose kernels all run the stored bytes in place compares no codes). The
predicate's ``passed`` is recomputed as every row that ran passed, and at least one ran -- the rule
``registry verify`` holds a stored statement to (:mod:`shardport.registry.artifact.evidence_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardport.registry.artifact.evidence_rows import RAN, ParityRow, status_of

from .up_finite import FINITE_ROW

#: Where each L0-L4 row's tolerance comes from, by (level, name prefix).
SOURCES: dict[tuple[str, str], str] = {
    ("L0", "bytes"): "exact: the pinned manifest's digest and its tiles' BLAKE3 digests",
    ("L1", "codes"): "exact: 0 mismatches against the codes as stored",
    ("L2", "layout"): "each operator's conversion budget from its scales (kernels.budget), else exact",
    ("L3", "operator"): "each kernel's tol_kernel + the conversion budget's operator bound (kernels.parity)",
    ("L4", "logits"): "derived from L3's E_kernel (parity_l4.tolerance_derivation, L4_BUDGETS by dtype)",
    ("L4", "top-1"): "exact: the float32 reference's argmax at every prompt position",
    ("L4", "greedy"): "exact: the float32 reference's argmax at every decode step",
    ("L4", "KV cache"): "rank_ops.cache_tolerance (the run's activations, layers and logit scale)",
    ("L5", FINITE_ROW): "RFC 8785 canonical JSON: no NaN or infinity can be signed",
}


def _numbers(doc: Any) -> int:
    if isinstance(doc, Mapping):
        return sum(_numbers(v) for v in doc.values())
    if isinstance(doc, list | tuple):
        return sum(_numbers(v) for v in doc)
    return int(isinstance(doc, int | float) and not isinstance(doc, bool))


def measured_counts(reports: Sequence[Mapping[str, Any]], parity: Mapping[str, Any]) -> dict[str, int]:
    """How many quantities each L0-L4 row measured, by level or row name prefix."""
    ladders = [lad for r in reports for lad in r.get("ladders", [])]
    full = [lad for lad in ladders if lad.get("scope", "full") == "full"]
    return {
        "L0": len(ladders),
        "L1": sum(int(lad["l1"]["codes_compared"]) for lad in ladders),
        "L2": len(full),
        "L3": sum(len(lad["l3"]) for lad in full),
        "logits": int(parity.get("positions", 0)),
        "top-1": len(parity.get("top1_agree", [])),
        "greedy": len(parity.get("tokens", [])),
        "KV cache": len(reports),
    }


def _defaults(row: Mapping[str, Any], counts: Mapping[str, int], numbers: int) -> dict[str, Any]:
    level, name = str(row["level"]), str(row["name"])
    out = dict(row)
    if "tolerance_source" not in out:
        out["tolerance_source"] = next(
            (src for (lv, prefix), src in SOURCES.items() if lv == level and name.startswith(prefix)), None
        )
    if "measured" not in out:
        if name == FINITE_ROW:
            out["measured"] = numbers
        elif level in ("L0", "L1", "L2", "L3"):
            out["measured"] = counts.get(level)
        else:
            out["measured"] = next((n for k, n in counts.items() if name.startswith(k)), None)
    return out


def finish(pred: dict[str, Any], counts: Mapping[str, int]) -> dict[str, Any]:
    """``pred`` with every parity row typed and complete and ``passed`` recomputed (see the module)."""
    numbers = _numbers(pred)
    rows: list[dict[str, Any]] = []
    for raw in pred.get("parity", []):
        row = _defaults(raw, counts, numbers)
        row["status"] = status_of(row.get("passed"), row.get("status"))
        if row["status"] == "pass" and not row.get("measured"):
            row.update(status="not applicable", passed=None)
            row["detail"] = f"{row.get('detail') or ''}; measured nothing: not a pass".lstrip("; ")
        if row["status"] not in RAN:
            row["passed"] = None
        rows.append(ParityRow.model_validate(row).model_dump(mode="json"))
    ran = [r for r in rows if r["status"] in RAN]
    return {**pred, "parity": rows, "passed": bool(ran) and all(r["status"] == "pass" for r in ran)}
