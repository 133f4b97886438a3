"""L5 against the manifest: each rank's selected kernel compared with the kernel push pinned for it.

The manifest's ``runtime.expected_kernels`` (:mod:`shardport.kernels.expectations`, computed at push by
admission over the catalogue) names, per weight class, device class and activation dtype run, the kernel
a whole weight gets. :func:`check_pins` reads the pins for every trace they cover — a trace whose slice is
the whole weight (tp = 1; pins are computed for the whole weight, a slice may miss a kernel's multiple),
on a device class the manifest pins (``cpu/<activations>``; ``cuda-sm80/bfloat16`` on sm80 and newer),
whose pin names a kernel (a pin of None: nothing admitted under the default policy, the run chose its own
``--fallback``) — and lists each trace that selected another kernel. The rest are counted as not pinned.
Pure: the manifest and the rank reports in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardport.kernels.capability import OperatorSignature
from shardport.kernels.catalog import default_catalog
from shardport.kernels.expectations import pinned_kernel
from shardport.registry.artifact.manifest import Manifest


def device_class(op: OperatorSignature, activations: str) -> str | None:
    """The pinned device class of a trace on a rank that asked for ``activations`` (None: not pinned).

    A CPU is pinned when no kernel of the catalogue tells its ISA from ``DEFAULT`` (the pins' ISA).
    """
    if op.device.kind == "cpu":
        isas = [k.capability.cpu_isas for k in default_catalog() if k.capability.cpu_isas is not None]
        if any((op.device.isa in listed) != ("DEFAULT" in listed) for listed in isas):
            return None
        return f"cpu/{activations}" if activations in ("float32", "bfloat16") else None
    if op.device.cc is not None and op.device.cc >= (8, 0) and activations == "bfloat16":
        return "cuda-sm80/bfloat16"
    return None


def _stacked(where: str) -> str:
    """The manifest weight of a trace's ``name[N=…, K=…]`` (an expert's ``name[expert 3][N=…]`` too)."""
    name = where.rsplit("[N=", 1)[0]
    return name.split("[expert ", 1)[0]


def _policy_refused(trace: Mapping[str, Any], kernel: str) -> bool:
    """Whether ``trace`` shows ``kernel`` refused by the run's fallback policy."""
    for c in trace.get("candidates", []):
        if c.get("kernel") == kernel:
            refusals = c.get("admission", {}).get("refusals", [])
            return any(str(x.get("reason")) == "policy" for x in refusals)
    return False


def check_pins(manifest: Manifest, reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every covered trace's selected kernel against its pin.

    Returns ``{pinned, checked, not_pinned, policy_refused, unexpected, passed}``; ``pinned``: whether the
    manifest has the layer at all (older manifests pass unchecked). The pins were computed under the
    default fallback policy: a trace whose pinned kernel the run's stricter ``--fallback`` refused (its
    candidate's refusal says ``policy``; e.g. ``forbid`` refuses int4pack's bfloat16 conversion) is not
    held to the pin, and counted in ``policy_refused``.
    """
    runtime = manifest.runtime
    extents = {w.name: tuple(w.shape.extents[-2:]) for w in manifest.weights or ()}
    checked = skipped = refused = 0
    unexpected: list[str] = []
    for r in reports:
        asked = str(r.get("activations", "float32"))
        for t in r.get("dispatch", []):
            op = OperatorSignature.model_validate(t["requested"])
            name = _stacked(str(t["weight"]))
            whole = (op.row_start, op.col_start) == (0, 0) and (op.n_local, op.k_local) == extents.get(name)
            cls = device_class(op, asked)
            pin = pinned_kernel(runtime, name, op, cls) if whole and cls else None
            if pin is None or pin.kernel is None:
                skipped += 1
                continue
            if pin.kernel != t["selected"] and _policy_refused(t, pin.kernel):
                refused += 1
                continue
            checked += 1
            if pin.kernel != t["selected"]:
                unexpected.append(
                    f"rank {r['rank']} {t['weight']} ({t['phase']}): {t['selected']}, "
                    f"the manifest pins {pin.kernel} ({pin.weight_class}, {cls}, {pin.activations})"
                )
    return {
        "pinned": bool(runtime.expected_kernels),
        "checked": checked,
        "not_pinned": skipped,
        "policy_refused": refused,
        "unexpected": unexpected,
        "passed": not unexpected,
    }
