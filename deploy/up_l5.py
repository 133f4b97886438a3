"""L5 of a bring-up: dispatch against the manifest's pins, fallbacks, measured float copies, memory.

Pure: the ranks' reports, the policy and the manifest's pins (:func:`.pinned_kernels.check_pins`) in;
:func:`level5`'s section and :func:`l5_rows`' parity rows out. Each row measures a quantity against a
tolerance from a source outside the check itself, or says ``not applicable`` and why:

- expected kernel: each trace's selected kernel against the kernel push pinned for its weight class,
  device class and activations (``runtime.expected_kernels``); traces no pin covers (a tp > 1 slice, a
  device class the manifest does not pin) are counted and said. A manifest pushed before the pins:
  ``not applicable`` (dispatch's own order recomputed here, :func:`expected_kernel`, is given in the
  detail as the weaker check it is: it re-runs dispatch's walk and so only disagrees where a kernel's
  preparation refused);
- fallbacks: traces in a transformation class the ``--fallback`` policy forbids;
- no persistent full dequant: the float buffers of a weight's size each rank *measured* alive after
  preparation (:mod:`.float_scan`), outside the policy (a ``full-dequant`` operator's own copy is
  within it only where the policy allows full dequantization; an unattributed one never is);
- loaded planes released: bytes of loaded planes no operator uses, still alive (:mod:`.release`);
- resident host memory: each rank's RSS growth since it began preparing against its ledger
  (:func:`resident_bound`);
- device memory: on a CUDA rank, torch's allocated bytes against the prepared operators and the ledger
  (:func:`device_check`); ``not applicable`` where every rank computes on the CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from shardport.kernels import FallbackPolicy, OperatorSignature, admit, default_catalog, named, ordered

#: Slack of the resident-memory check, over the ledger's components: what a rank's process grows by
#: that no component accounts for -- torch's lazy runtime (thread pools, kernel caches, the first
#: matmul's allocations), gloo's buffers, the interpreter's own growth, allocator fragmentation left
#: after ``malloc_trim``. Measured (docs/design-notes.md, "Bring-up"): see :func:`resident_bound`.
RESIDENT_SLACK = 96 * 1024 * 1024
#: Slack of the device-memory check on a CUDA rank: kernels' workspaces, transient activations.
DEVICE_SLACK = 64 * 1024 * 1024
#: What lives on the device of a CUDA rank (the graph's tensors follow its device).
DEVICE_COMPONENTS = ("prepared_operators", "float_tensors", "kv_cache")
#: What a rank's resident memory is made of (the predicate's ``ledger``, drawn stacked). The loaded
#: planes count only where the rank retains them beyond what its operators and float tensors use in
#: place (``codes_retained_unused``, :mod:`.release`; 0 after a clean release); what it loaded
#: (``codes_and_qparams``), retained, shared and released are measures.
LEDGER_COMPONENTS = (
    "codes_retained_unused",
    "prepared_operators",
    "float_tensors",
    "kv_cache",
    "repack_workspace_peak",
)
NOT_APPLICABLE = "not applicable"


def expected_kernel(
    op: OperatorSignature, policy: FallbackPolicy, preferred: Sequence[str], required: Sequence[str] = ()
) -> str | None:
    """The kernel dispatch's own order gives ``op``: the first admitted and policy-allowed.

    The order is :func:`shardport.kernels.ordered`'s for the operator's activation dtype (the
    manifest's preferred kernels, then the fast paths, then the slow paths, then the fallback classes);
    with ``required`` kernels, only those. A recomputation of dispatch, not an independent expectation:
    L5 compares with the manifest's pins (:func:`.pinned_kernels.check_pins`) instead.
    """
    for kernel in ordered(default_catalog(), op.activation_dtype, preferred):
        cap = kernel.capability
        if required and not named(kernel, required):
            continue
        if admit(op, cap).accepted and policy.mode(cap.transformation) != "forbid":
            return f"{cap.id}@{cap.version}"
    return None


def kernel_path(trace: Mapping[str, Any]) -> Literal["fast", "slow"]:
    """``slow`` where a trace's selected kernel runs its slow path for the dtype (its candidate note)."""
    slow = any(c.get("selected") and c.get("note") for c in trace.get("candidates", []))
    return "slow" if slow else "fast"


def device_check(device: str, ledger: Mapping[str, Any]) -> dict[str, Any]:
    """A rank's device memory against its ledger (pure: the rank's device and ledger in).

    On a CUDA rank (``device`` ``cuda:…``) the bytes torch holds allocated after generation must hold
    the prepared operators at least (the ledger cannot claim operators the device does not hold), and at
    most ``2 x (prepared operators + float tensors + KV cache) + DEVICE_SLACK`` (no persistent copy
    beyond the ledger). A CPU rank has no device memory: ``passed`` None, ``status`` not applicable (one
    that reports device memory fails).
    """
    resident, peak = int(ledger.get("device_resident", 0)), int(ledger.get("device_peak", 0))
    if not device.startswith("cuda") and (resident or peak):
        return {
            "device": device,
            "resident": resident,
            "peak": peak,
            "passed": False,
            "status": "fail",
            "detail": f"a CPU rank reported device memory: resident {resident}, peak {peak}",
        }
    if not device.startswith("cuda"):
        return {
            "device": device,
            "resident": resident,
            "peak": peak,
            "passed": None,
            "status": NOT_APPLICABLE,
            "detail": "no device memory: the rank computes on the CPU",
        }
    operators = int(ledger.get("prepared_operators", 0))
    accounted = sum(int(ledger.get(c, 0)) for c in DEVICE_COMPONENTS)
    bound = 2 * accounted + DEVICE_SLACK
    passed = operators <= resident <= bound
    return {
        "device": device,
        "resident": resident,
        "peak": peak,
        "operators": operators,
        "ledger": accounted,
        "bound": bound,
        "passed": passed,
        "status": "pass" if passed else "fail",
        "detail": f"prepared operators {operators} <= resident {resident} <= 2 x {accounted} + slack",
    }


def components(ledger: Mapping[str, Any]) -> dict[str, int]:
    """A rank ledger's :data:`LEDGER_COMPONENTS` (bytes).

    A ledger that does not say what the rank retained after preparation (no ``codes_retained``)
    counts every loaded byte as kept and unused.
    """
    out = {c: int(ledger.get(c, 0)) for c in LEDGER_COMPONENTS}
    if "codes_retained" not in ledger:
        out["codes_retained_unused"] = int(ledger.get("codes_and_qparams", 0))
    return out


def resident_bound(ledger: Mapping[str, Any]) -> tuple[int, int]:
    """(the ledger's components, the bound on the rank's resident growth): ``components + slack``.

    Every component is memory the rank holds at the end (the repack workspace's peak is freed, but a
    freed heap's pages may stay mapped), so the growth is the components plus what no component
    accounts for, :data:`RESIDENT_SLACK`.
    """
    accounted = sum(components(ledger).values())
    return accounted, accounted + RESIDENT_SLACK


def _pins_section(pins: Mapping[str, Any] | None, reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The expected-kernel part of L5: the pins' verdict, and dispatch's order recomputed (weaker)."""
    recomputed: list[str] = []
    traces = 0
    for r in reports:
        for t in r.get("dispatch", []):
            traces += 1
            want = expected_kernel(
                OperatorSignature.model_validate(t["requested"]),
                FallbackPolicy.model_validate(t["policy"]) if "policy" in t else FallbackPolicy(),
                tuple(t.get("preferred", ())),
                tuple(t.get("required", ())),
            )
            if want != t["selected"]:
                recomputed.append(
                    f"rank {r['rank']} {t['weight']} ({t['phase']}): {t['selected']}, order gives {want}"
                )
    pins = dict(pins or {"pinned": False, "checked": 0, "not_pinned": traces, "unexpected": []})
    return {**pins, "traces": traces, "recomputed_disagree": recomputed}


def _float_section(reports: Sequence[Mapping[str, Any]], policy: FallbackPolicy) -> dict[str, Any]:
    """The measured full-size float buffers of every rank, each within the policy or not."""
    allow = policy.full_dequant != "forbid"
    outside: list[str] = []
    within: list[str] = []
    operators = buffers = total = 0
    missing: list[str] = []
    for r in reports:
        scan = r.get("float_buffers")
        if scan is None:
            missing.append(str(r["rank"]))
            continue
        operators += int(scan["operators"])
        buffers += int(scan["buffers"])
        for b in scan["full_size"]:
            total += int(b["bytes"])
            what = b["weight"] or f"unattributed ({b['where']})"
            line = f"rank {r['rank']} {what}: {b['dtype']} {b['elements']} elements, {b['bytes']} bytes"
            ok = b["weight"] is not None and b["transformation"] == "full-dequant" and allow
            (within if ok else outside).append(line)
    return {
        "operators": operators,
        "buffers": buffers,
        "full_size_bytes": total,
        "outside_policy": outside,
        "within_policy": within,
        "not_measured": missing,
    }


def level5(
    reports: Sequence[Mapping[str, Any]], policy: FallbackPolicy, pins: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """L5's measures over the ranks' reports (see the module docstring); ``passed``: every row that ran.

    ``pins``: :func:`.pinned_kernels.check_pins` of the pinned manifest (None: no manifest to read).
    """
    kernels = _pins_section(pins, reports)
    classes: Counter[str] = Counter(t["transformation"] for r in reports for t in r.get("dispatch", []))
    over = {c: n for c, n in classes.items() if policy.mode(c) == "forbid"}  # type: ignore[arg-type,unused-ignore]
    resident: dict[str, dict[str, Any]] = {}
    for r in reports:
        accounted, bound = resident_bound(r["ledger"])
        growth = int(r["ledger"].get("host_resident_growth", 0))
        unused = components(r["ledger"])["codes_retained_unused"]
        resident[str(r["rank"])] = {
            "growth": growth,
            "ledger": accounted,
            "bound": bound,
            "unused": unused,
            "passed": growth <= bound and unused == 0,
        }
    device = {str(r["rank"]): device_check(str(r.get("device", "cpu")), r["ledger"]) for r in reports}
    out = {
        "traces_checked": int(kernels["checked"]),
        "traces_not_pinned": int(kernels["not_pinned"]),
        "traces_policy_refused": int(kernels.get("policy_refused", 0)),
        "pinned": bool(kernels["pinned"]),
        "unexpected_kernels": list(kernels["unexpected"]),
        "recomputed_disagree": kernels["recomputed_disagree"],
        "traces": kernels["traces"],
        "fallbacks": dict(classes),
        "forbidden_fallbacks": over,
        "policy": policy.model_dump(mode="json"),
        "full_dequant_buffers": {  # by the kernels' label; measured: float_buffers
            str(r["rank"]): r["full_dequant_persistent"] for r in reports if r.get("full_dequant_persistent")
        },
        "float_buffers": _float_section(reports, policy),
        "resident": resident,
        "device": device,
    }
    rows = l5_rows(out)
    out["passed"] = all(row["passed"] for row in rows if row["passed"] is not None)
    return out


def _row(
    name: str,
    value: Any,
    tolerance: Any,
    source: str | None,
    measured: int,
    detail: str,
    passed: bool | None,
    status: str | None = None,
) -> dict[str, Any]:
    return {
        "level": "L5",
        "name": name,
        "passed": passed,
        "status": status or ("pass" if passed else "fail"),
        "value": value,
        "tolerance": tolerance,
        "tolerance_source": source,
        "measured": measured,
        "detail": detail,
    }


def _not_applicable(name: str, why: str, measured: int = 0) -> dict[str, Any]:
    return _row(name, None, None, "", measured, why, None, NOT_APPLICABLE) | {"tolerance_source": None}


def _kernel_row(l5: Mapping[str, Any]) -> dict[str, Any]:
    name = "expected kernel on every weight of every rank"
    checked, skipped, bad = l5["traces_checked"], l5["traces_not_pinned"], l5["unexpected_kernels"]
    refused = int(l5.get("traces_policy_refused", 0))
    weaker = (
        f"dispatch's order recomputed by the driver (weaker: the same walk): "
        f"{l5['traces'] - len(l5['recomputed_disagree'])} of {l5['traces']} traces agree"
        + (f" ({'; '.join(l5['recomputed_disagree'][:3])})" if l5["recomputed_disagree"] else "")
    )
    if not l5["pinned"]:
        return _not_applicable(
            name,
            f"the manifest pins no kernels (pushed before runtime.expected_kernels; "
            f"push it again to pin them); {weaker}",
        )
    if checked == 0:
        return _not_applicable(
            name,
            f"no trace is covered by a pin: {skipped} traces (the pins are for "
            f"whole weights on a pinned device class; tp > 1 slices are not); {weaker}",
        )
    detail = (
        f"{checked} traces against the manifest's pins, {skipped} not covered by a pin (tp > 1 slices, "
        f"unpinned device classes); "
        + (f"{refused} whose pinned kernel the run's --fallback refuses; " if refused else "")
        + ("; ".join(bad[:4]) or "all as pinned")
    )
    source = "manifest runtime.expected_kernels (pinned at push by admission over the catalogue)"
    return _row(name, len(bad), 0, source, checked, detail, not bad)


def _fallback_row(l5: Mapping[str, Any]) -> dict[str, Any]:
    name = "fallbacks within policy"
    traces = sum(l5["fallbacks"].values())
    if traces == 0:
        return _not_applicable(name, "no quantized operator was dispatched")
    over = l5["forbidden_fallbacks"]
    policy = l5["policy"]
    source = f"--fallback policy: conversion {policy['conversion']}, generic {policy['generic']}, " + (
        f"full-dequant {policy['full_dequant']}"
    )
    detail = f"traces per transformation {dict(sorted(l5['fallbacks'].items()))}" + (
        f"; forbidden: {over}" if over else ""
    )
    return _row(name, sum(over.values()), 0, source, traces, detail, not over)


def _dequant_row(l5: Mapping[str, Any]) -> dict[str, Any]:
    name = "no persistent full dequant (measured)"
    f = l5["float_buffers"]
    if f["not_measured"]:
        return _row(
            name, None, None, None, 0, f"ranks {f['not_measured']} measured no float buffers", None, "not run"
        ) | {"tolerance_source": None}
    if f["operators"] == 0:
        return _not_applicable(name, "no quantized operator was prepared")
    outside = f["outside_policy"]
    detail = (
        f"{f['operators']} operators and {f['buffers']} float buffers >= 4 KiB measured after preparation; "
        f"full-size float copies: {len(outside) + len(f['within_policy'])} ({f['full_size_bytes']} bytes)"
        + (f"; outside the policy: {'; '.join(outside[:4])}" if outside else "")
        + (f"; allowed by the policy: {'; '.join(f['within_policy'][:4])}" if f["within_policy"] else "")
    )
    source = f"--fallback policy: full-dequant {l5['policy']['full_dequant']} (an unattributed copy: never)"
    return _row(name, len(outside), 0, source, f["operators"], detail, not outside)


def _memory_rows(l5: Mapping[str, Any]) -> list[dict[str, Any]]:
    res = l5["resident"]
    unused = sum(int(v["unused"]) for v in res.values())
    rows = [
        _row(
            "loaded planes no operator uses released",
            unused,
            0,
            "release: every loaded plane no prepared operator or float tensor uses is dropped",
            len(res),
            "; ".join(f"rank {k}: {v['unused']} bytes kept unused" for k, v in res.items()),
            unused == 0,
        ),
    ]
    worst = max(res.items(), key=lambda kv: int(kv[1]["growth"]) - int(kv[1]["bound"]), default=None)
    if worst is None:
        rows.append(_not_applicable("resident host memory within the ledger", "no rank reported"))
    else:
        k, v = worst
        rows.append(
            _row(
                "resident host memory within the ledger",
                int(v["growth"]),
                int(v["bound"]),
                f"the rank's ledger components + RESIDENT_SLACK {RESIDENT_SLACK // (1 << 20)} MiB",
                len(res),
                "per rank growth since preparing vs ledger + slack: "
                + "; ".join(f"rank {r}: {x['growth']} <= {x['bound']}" for r, x in res.items())
                + f" (worst: rank {k})",
                all(int(x["growth"]) <= int(x["bound"]) for x in res.values()),
            )
        )
    cuda = {k: v for k, v in l5["device"].items() if v["passed"] is not None}  # a CPU rank failing too
    name = "device memory within the ledger"
    if not cuda:
        rows.append(_not_applicable(name, "every rank computes on the CPU: no device memory to measure"))
        return rows
    k, v = max(cuda.items(), key=lambda kv: int(kv[1]["resident"]) - int(kv[1]["bound"]))
    detail = "; ".join(f"rank {r} {x['device']}: {x['detail']}" for r, x in cuda.items())
    rows.append(
        _row(
            name,
            int(v["resident"]),
            int(v["bound"]),
            f"the ledger: prepared operators <= allocated <= 2 x device components + "
            f"{DEVICE_SLACK // (1 << 20)} MiB",
            len(cuda),
            detail,
            all(x["passed"] for x in cuda.values()),
        )
    )
    return rows


def l5_rows(l5: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The L5 rows of the parity table (the finite row is added by :func:`.up_finite.seal`'s caller)."""
    return [_kernel_row(l5), _fallback_row(l5), _dequant_row(l5), *_memory_rows(l5)]
