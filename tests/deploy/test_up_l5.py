"""L5 rows that can fail: fed with real rank reports of one in-process bring-up of the tiny GGUF mix.

One bring-up (module fixture, ~10 s) gives the reports, the pinned manifest and the signed evidence; each
test then changes one thing the row measures against -- the manifest's pins, a float buffer an operator
keeps, the resident growth -- and checks that the evidence says ``fail`` with the number. The leaked
buffer is measured for real (:mod:`shardport.deploy.float_scan` over a prepared rank's operators).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gguf_tiny
from llama_artifacts import ok

from shardport.deploy.pinned_kernels import check_pins
from shardport.deploy.rank import Rank, RankSpec
from shardport.deploy.rank_ops import policy_of
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up
from shardport.deploy.up_l5 import RESIDENT_SLACK, l5_rows, level5
from shardport.deploy.up_rows import finish
from shardport.registry.artifact.evidence_rows import verdict_findings
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.session import Session
from shardport.registry.verify import verify_ref

PROMPT = (1, 5, 300, 7, 396)
STATUSES = {"pass", "fail", "not applicable", "not run"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One tp-1 bring-up of the tiny GGUF mix, evidence stored: store, manifest, reports, predicate."""
    tmp = tmp_path_factory.mktemp("l5")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(tmp / "home"))
        store = str(tmp / "store")
        ok(store, "keygen")
        ok(store, "push", gguf_tiny(tmp / "g"), "g:v1")
        session = Session.open(store)
        request = UpRequest(ref="g:v1", tokens=PROMPT, steps=2, store=store, address="local")
        result = bring_up(session, request, launcher=run_in_process)
        manifest = Manifest.from_bytes(session.store.read_blob(result.digest))
        yield {"store": store, "manifest": manifest, "reports": result.reports, "result": result}


def _row(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(r for r in rows if r["name"].startswith(prefix))


def _rows(reports: list[dict[str, Any]], manifest: Manifest, fallback: str = "warn") -> list[dict[str, Any]]:
    """The L5 rows as the driver draws them, finished as in the predicate."""
    l5 = level5(reports, policy_of(fallback), check_pins(manifest, reports))
    return finish({"parity": l5_rows(l5)}, {})["parity"]


def test_every_row_says_status_value_tolerance_and_its_source(run: dict[str, Any]) -> None:
    pred = run["result"].predicate
    for row in pred["parity"]:
        assert row["status"] in STATUSES and {"value", "tolerance", "tolerance_source", "measured"} <= set(
            row
        )
        assert row["passed"] is {"pass": True, "fail": False}.get(row["status"]), row
        if row["status"] == "pass":
            assert row["measured"] > 0 and row["tolerance_source"], row
    assert pred["passed"] and verdict_findings(pred) == []
    rows = pred["parity"]
    device = _row(rows, "device memory")
    assert device["status"] == "not applicable" and "CPU" in device["detail"]  # not 0 = 0 on a CPU rank
    kernel = _row(rows, "expected kernel")
    n = len(pred["dispatch"])
    assert kernel["status"] == "pass" and kernel["measured"] == n and kernel["value"] == 0
    assert "runtime.expected_kernels" in kernel["tolerance_source"]
    quant = _row(rows, "E_quant")  # pushed without --reference: said, not passed
    assert quant["status"] == "not applicable" and "--reference" in quant["detail"], quant
    assert pred["placement"]["agree"] and pred["placement"]["plan_sha256"].startswith("sha256:")
    groups = pred["dispatch_candidates"]
    assert sum(g["weights"] for g in groups) == n and all(g["candidates"] for g in groups)
    refused = [c for g in groups for c in g["candidates"] if c["reasons"]]
    assert refused and all(":" in why for c in refused for why in c["reasons"])
    assert pred["ladder_values"]["blob"] and pred["ladder_values"]["operators"] > 0
    with pytest.MonkeyPatch.context() as mp:  # the stored statement and its attachment verify
        mp.setenv("SHARDPORT_HOME", str(Path(run["store"]).parent / "home"))
        report = verify_ref(Session.open(run["store"]), parse_ref("g:v1"))
    assert report.ok and report.evidence_verified == 1, report.findings


def test_a_kernel_other_than_the_manifest_pins_fails_the_row(run: dict[str, Any]) -> None:
    manifest: Manifest = run["manifest"]
    runtime = manifest.runtime
    other = "reference@1"
    moved = [e.model_copy(update={"kernel": other}) for e in runtime.expected_kernels or ()]
    pinned_other = manifest.model_copy(
        update={"runtime": runtime.model_copy(update={"expected_kernels": moved})}
    )
    row = _row(_rows(run["reports"], pinned_other), "expected kernel")
    traces = sum(len(r["dispatch"]) for r in run["reports"])
    assert row["status"] == "fail" and row["passed"] is False
    assert row["value"] == traces and row["tolerance"] == 0 and row["measured"] == traces
    assert f"the manifest pins {other}" in row["detail"]
    older = manifest.model_copy(update={"runtime": runtime.model_copy(update={"expected_kernels": None})})
    row = _row(_rows(run["reports"], older), "expected kernel")
    assert row["status"] == "not applicable" and row["passed"] is None
    assert "pins no kernels" in row["detail"] and "weaker" in row["detail"]


def test_a_full_size_float_buffer_kept_by_an_operator_fails_the_row(run: dict[str, Any]) -> None:
    import torch

    store = run["store"]
    spec = RankSpec(
        ref=f"g@{run['result'].digest}", store=store, home=os.environ.get("SHARDPORT_HOME"), s3_endpoint=None,
        tp=1, ep=1, pp=1, rank=0, fallback="warn", prompt=PROMPT, steps=2, ladder="off",
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(Path(store).parent / "home"))
        rank = Rank(spec)
        assert "failure" not in rank.prepare()
    assert rank.float_buffers is not None and rank.float_buffers["full_size"] == []
    name, phases = sorted(rank.ops.ops.items())[0]
    op = phases["decode"]
    op.kept = torch.zeros(op.op.n_local, op.op.k_local)  # a kernel that forgot its dequantized weight
    scan = rank._scan_floats()
    (found,) = scan["full_size"]
    assert found["weight"] == name and found["bytes"] == op.op.n_local * op.op.k_local * 4
    reports = copy.deepcopy(run["reports"])
    reports[0]["float_buffers"] = scan
    row = _row(_rows(reports, run["manifest"]), "no persistent full dequant")
    assert row["status"] == "fail" and row["value"] == 1 and row["tolerance"] == 0
    assert name in row["detail"] and str(found["bytes"]) in row["detail"]


def test_full_dequant_copies_are_measured_and_held_to_the_policy(home: Path, tmp_path: Path) -> None:
    """A real full dequantization (the manifest requires the kernel; ``--fallback allow``) keeps one copy
    per weight: measured on the rank, within a policy that allows it, failing one that forbids it."""
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gguf_tiny(tmp_path / "g"), "g:v1", "--kernels-required", "full-dequant")
    spec = RankSpec(
        ref="g:v1", store=store, home=str(home), s3_endpoint=None, tp=1, ep=1, pp=1, rank=0, fallback="allow",
        prompt=PROMPT, steps=2, ladder="off",
    )  # fmt: skip
    rank = Rank(spec)
    assert "failure" not in rank.prepare()
    assert rank.float_buffers is not None
    copies = rank.float_buffers["full_size"]
    assert (
        copies and {c["weight"] for c in copies} == set(rank.ops.ops) and rank.ops.persistent_full_dequant()
    )
    assert all(c["transformation"] == "full-dequant" and c["where"] == "operator" for c in copies)
    manifest = rank.manifest
    report = {"rank": 0, "dispatch": [t.model_dump(mode="json") for t in rank.ops.traces],
              "float_buffers": rank.float_buffers, "ledger": {**rank.ledger, "host_resident_growth": 0},
              "full_dequant_persistent": rank.ops.persistent_full_dequant()}  # fmt: skip
    allowed = _row(_rows([report], manifest, "allow"), "no persistent full dequant")
    assert (
        allowed["status"] == "pass" and allowed["value"] == 0 and "allowed by the policy" in allowed["detail"]
    )
    forbidden = _row(_rows([report], manifest, "warn"), "no persistent full dequant")
    assert forbidden["status"] == "fail" and forbidden["value"] == len(copies) and forbidden["tolerance"] == 0
    # the same traces under a policy that forbids full dequantization: the fallback row fails too
    fallback = _row(_rows([report], manifest, "warn"), "fallbacks within policy")
    assert fallback["status"] == "fail" and fallback["value"] == len(report["dispatch"]) > 0
    assert "full-dequant forbid" in fallback["tolerance_source"]
    assert _row(_rows([report], manifest, "allow"), "fallbacks within policy")["status"] == "pass"


def test_resident_growth_over_the_ledger_bound_fails_the_row(run: dict[str, Any]) -> None:
    reports = copy.deepcopy(run["reports"])
    ledger = reports[0]["ledger"]
    row = _row(_rows(reports, run["manifest"]), "resident host memory")
    assert row["status"] == "pass" and row["value"] == ledger["host_resident_growth"] <= row["tolerance"]
    bound = row["tolerance"]
    assert bound == sum(run["result"].predicate["ledger"]["0"].values()) + RESIDENT_SLACK
    ledger["host_resident_growth"] = bound + 1
    row = _row(_rows(reports, run["manifest"]), "resident host memory")
    assert row["status"] == "fail" and (row["value"], row["tolerance"]) == (bound + 1, bound)
    assert f"{bound + 1} <= {bound}" in row["detail"]


def test_a_pass_that_measured_nothing_is_not_a_pass() -> None:
    row = {
        "level": "L5",
        "name": "x",
        "passed": True,
        "value": 0,
        "tolerance": 0,
        "measured": 0,
        "detail": "",
    }
    done = finish({"parity": [row]}, {})
    assert (
        done["parity"][0]["status"] == "not applicable" and "measured nothing" in done["parity"][0]["detail"]
    )
    assert done["passed"] is False  # no row ran: nothing passed


def test_the_driver_refuses_a_malformed_rank_report_by_rank_and_field(run: dict[str, Any]) -> None:
    from shardport.deploy.errors import DeployError
    from shardport.deploy.rank_report import check_reports

    reports = copy.deepcopy(run["reports"])
    (typed,) = check_reports(reports)
    assert typed.rank == 0 and typed.float_buffers.operators == len(typed.dispatch) // 2
    reports[0]["ledger"]["host_resident_growth"] = "a lot"
    with pytest.raises(DeployError, match=r"rank 0 reported a malformed 'ledger\.host_resident_growth'"):
        check_reports(reports)
    reports[0]["ledger"]["host_resident_growth"] = 0
    del reports[0]["float_buffers"]
    with pytest.raises(DeployError, match="'float_buffers'"):
        check_reports(reports)
