"""Every kind of defect the ladder exists for, made for real inside a rank (:mod:`shardport.deploy.faults`),
fails its rows in the signed evidence with the number measured -- and the bring-up exits 1.

In-process bring-ups of the tiny GPTQ llama at tp 1 with ``--ladder full`` (every operator's full ladder:
under ``sample`` only each class's representative is reconstructed, so a defect on another weight of
the class is left to L4), a few seconds each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gptq_tiny
from llama_artifacts import ok

from shardport.deploy.faults import FAULT_ENV, armed
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up
from shardport.registry.artifact.evidence_rows import verdict_findings
from shardport.registry.session import Session

PROMPT = (1, 5, 300, 7, 396)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(tmp / "home"))
        url = str(tmp / "store")
        ok(url, "keygen")
        ok(url, "push", gptq_tiny(tmp / "gptq"), "llama/gptq:v1")
    return url


@pytest.fixture(scope="module")
def packed(store: str) -> str:
    """The same checkpoint pushed preferring int4pack: its layout is repacked, bytes of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(Path(store).parent / "home"))
        folder = Path(store).parent / "gptq"
        ok(store, "push", folder, "llama/gptq:packed", "--kernels-preferred", "cpu.int4pack")
    return store


def _up(store: str, fault: str | None, monkeypatch: pytest.MonkeyPatch, tag: str = "v1") -> dict[str, Any]:
    monkeypatch.setenv("SHARDPORT_HOME", str(Path(store).parent / "home"))
    if fault is not None:
        monkeypatch.setenv(FAULT_ENV, fault)
    request = UpRequest(ref=f"llama/gptq:{tag}", tokens=PROMPT, steps=3, store=store, ladder="full")
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    pred: dict[str, Any] = result.predicate
    assert verdict_findings(pred) == []  # the verdict is what its rows say, failing or not
    return pred


def _failed(pred: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in pred["parity"] if row["status"] == "fail"}


def test_without_a_fault_every_row_that_ran_passes(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pred = _up(store, None, monkeypatch)
    assert pred["passed"] and not _failed(pred)
    l4 = pred["parity_l4"]  # |Δ| per prompt position and decode step: what the report's L4 chart draws
    assert len(l4["per_position_abs_diff"]) == len(PROMPT) and len(l4["decode_per_step_abs_diff"]) == 3
    assert max(l4["per_position_abs_diff"]) == l4["max_abs_diff"]
    assert max(l4["decode_per_step_abs_diff"]) == l4["decode_max_abs_diff"]


def test_a_misscaled_layout_fails_l2_and_l3_with_the_error(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pred = _up(store, "rank0:misscale", monkeypatch)
    failed = _failed(pred)
    assert not pred["passed"]
    l2 = failed["layout decode = reference decode; witness rows"]
    l3 = failed["operator error vs reference (max E_kernel)"]
    assert l2["value"] > l2["tolerance"] and l3["value"] > l3["tolerance"], (l2, l3)
    assert 0.005 < l3["value"] < 0.02  # the 1 % scale, measured as a relative operator error


def test_a_flipped_code_in_a_repacked_layout_fails_l1_naming_the_place(
    packed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pred = _up(packed, "rank0:codes", monkeypatch, tag="packed")
    assert all(d["kernel"] == "cpu.int4pack@1" for d in pred["dispatch"])
    l1 = _failed(pred)["codes preserved by every layout"]
    assert not pred["passed"] and l1["value"] >= 1 and "row " in l1["detail"], l1


def test_a_leaked_float_copy_fails_the_measured_full_dequant_row(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pred = _up(store, "rank0:leak", monkeypatch)
    row = next(r for name, r in _failed(pred).items() if "full dequant" in name)
    assert not pred["passed"] and row["value"] >= 1, row


def test_a_corrupted_kv_cache_fails_the_cache_check_and_l4(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pred = _up(store, "rank0:kv-cache", monkeypatch)
    failed = _failed(pred)
    cache = failed["KV cache: decode steps = one fresh prefill"]
    assert not pred["passed"] and cache["value"] > cache["tolerance"], cache
    assert pred["parity_l4"]["decode_max_abs_diff"] > pred["parity_l4"]["tolerance"]


def test_a_malformed_fault_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "rank0:typo")
    with pytest.raises(ValueError, match="expected rank<R>"):
        armed(0)
    monkeypatch.setenv(FAULT_ENV, "rank1:leak")
    assert armed(0) is None and armed(1) == "leak"
