"""Bring-up on logits that prove nothing: NaN (a NaN norm pushed under ``--allow-nonfinite``) and all
zero (a zeroed final norm). The evidence is signed and stored, its rows fail, the CLI exits 1 with
strict JSON, and the report still draws its charts.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bringup_artifacts import gptq_tiny
from llama_artifacts import cli, ok
from safetensors.numpy import load_file, save_file

from shardport.cli import main
from shardport.deploy.graph.model import Generation
from shardport.deploy.graph.reference import compare
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.report import render_report
from shardport.deploy.up import UpRequest, bring_up
from shardport.deploy.up_finite import FINITE_ROW, seal
from shardport.provenance.canonical import canonical_bytes
from shardport.provenance.errors import NonFiniteNumberError
from shardport.registry.evidence import read_evidence
from shardport.registry.session import Session

PROMPT = (1, 5, 300, 7)


def _strict(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity (as a strict parser does)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _norm(folder: Path, fill: float | None = None, at: int | None = None) -> Path:
    """The final norm of ``folder``'s checkpoint: NaN at ``at``, or all ``fill``."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    norm = tensors["model.norm.weight"]
    if at is not None:
        norm[at] = np.nan
    else:
        norm[:] = fill
    save_file(tensors, str(path))
    return folder


def _push(home: Path, tmp: Path, folder: Path, ref: str, *options: str) -> str:
    store = str(tmp / "store")
    if not (home / "keys").exists():
        ok(store, "keygen")
    ok(store, "push", folder, ref, *options)
    return store


def _rows(pred: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in pred["parity"]}


def test_nan_logits_give_failing_signed_stored_evidence(home: Path, tmp_path: Path) -> None:
    folder = _norm(gptq_tiny(tmp_path / "ck"), at=7)
    store = _push(home, tmp_path, folder, "llama/nan:v1", "--allow-nonfinite")
    session = Session.open(store)
    request = UpRequest(ref="llama/nan:v1", tokens=PROMPT, steps=2, store=store, ladder="off")
    result = bring_up(session, request, launcher=run_in_process)
    assert bool(np.isnan(result.prompt_logits).all())  # the NaN reached every logit
    pred = result.predicate
    rows = _rows(pred)
    assert pred["passed"] is False
    delta = rows["logits max |Δ| vs float32 reference"]
    assert delta["passed"] is False and delta["value"] == "NaN" and "not finite" in delta["detail"]
    top1 = rows["top-1 agreement per position"]
    assert top1["passed"] is False and top1["value"] == 0 and "degenerate" in top1["detail"]
    greedy = rows["greedy tokens identical"]  # the same tokens (argmax of NaN), which prove nothing
    assert greedy["passed"] is False and "decode steps [0, 1]" in greedy["detail"]
    finite = rows[FINITE_ROW]
    assert (
        finite["passed"] is False
        and finite["value"] >= 3
        and "/parity_l4/max_abs_diff = NaN" in finite["detail"]
    )
    # signed and stored: it verifies and says it failed
    assert result.evidence is not None
    [stored] = read_evidence(session, "llama/nan", result.digest).verified
    assert stored.digest == result.evidence and stored.predicate["passed"] is False
    assert _rows(dict(stored.predicate))[FINITE_ROW]["passed"] is False
    _strict(json.dumps(result.to_json()))
    page = render_report(pred)
    data = re.search(r'id="evidence-data">(.*?)</script>', page, re.S)
    assert data is not None and _strict(data.group(1))["passed"] is False


def test_all_zero_logits_fail_top1_and_greedy(home: Path, tmp_path: Path) -> None:
    folder = _norm(gptq_tiny(tmp_path / "ck"), fill=0.0)
    store = _push(home, tmp_path, folder, "llama/zero:v1")  # zeros are finite: pushed as is
    request = UpRequest(ref="llama/zero:v1", tokens=PROMPT, steps=2, store=store, ladder="off")
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    assert not result.prompt_logits.any()  # every logit 0: every argmax is token 0 on both sides
    rows = _rows(result.predicate)
    assert rows["logits max |Δ| vs float32 reference"]["passed"] is True  # 0 <= tolerance: true, vacuous
    assert rows["top-1 agreement per position"]["passed"] is False
    assert rows["top-1 agreement per position"]["detail"].startswith("0000; degenerate")
    assert rows["greedy tokens identical"]["passed"] is False
    assert rows[FINITE_ROW]["passed"] is True
    assert result.predicate["passed"] is False


@pytest.mark.ray
@pytest.mark.slow
def test_cli_up_on_nan_logits_exits_1_with_strict_json_and_a_drawn_report(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    folder = _norm(gptq_tiny(tmp_path / "ck"), at=0)
    store = _push(home, tmp_path, folder, "llama/nan:v1", "--allow-nonfinite")
    report = tmp_path / "up.html"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(
            ["--store", store, "--json", "up", "llama/nan:v1", "--tokens", "1,5,300", "--generate", "2",
             "--ladder", "off", "--report", str(report)]
        )  # fmt: skip
    doc = _strict(buf.getvalue())
    assert code == 1, doc
    assert doc["passed"] is False and doc["evidence"] is not None
    assert _rows(doc)[FINITE_ROW]["passed"] is False
    _, listed = cli(store, "evidence", "llama/nan:v1")  # it verifies, and records a failed bring-up
    assert [e["passed"] for e in listed["evidence"]] == [False] and not listed.get("failures")
    page = report.read_text()
    assert "NaN" in page
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    assert browser is not None, "no headless Chromium: scripts/test.sh installs chromium-headless-shell"
    flags = ["--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"]
    dom = subprocess.run([browser, *flags, report.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-charts="drawn"' in dom.stdout
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []


def test_compare_fails_top1_on_nan_and_constant_rows() -> None:
    good = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 0.0]])
    for bad in (torch.full((2, 3), float("nan")), torch.zeros(2, 3)):
        run = Generation(bad, (0,), bad[1:])
        parity = compare(run, Generation(bad.clone(), (0,), bad[1:].clone()), tolerance=1.0)
        assert parity.top1_agree == (False, False) and parity.degenerate_positions == (0, 1)
        assert parity.degenerate_steps == (0,) and not parity.ok
    partial = good.clone()
    partial[1, 2] = float("inf")  # one infinite logit: that position is degenerate, the other agrees
    parity = compare(Generation(partial, (1,), good[:1]), Generation(good, (1,), good[:1]), tolerance=1.0)
    assert parity.top1_agree == (True, False) and parity.degenerate_positions == (1,)
    assert math.isinf(parity.max_abs_diff) and not parity.ok


def test_seal_writes_non_finite_values_as_text_and_fails_the_evidence() -> None:
    pred: dict[str, Any] = {
        "passed": True,
        "parity": [{"level": "L3", "name": "op", "passed": True, "value": float("nan"), "tolerance": 1.0}],
        "timeline": {"0": {"fetch": float("inf"), "repack": 0.5}},
    }
    with pytest.raises(NonFiniteNumberError, match="/parity/0/value, /timeline/0/fetch"):
        canonical_bytes(pred)  # the guard every signed statement goes through
    sealed = seal(pred)
    assert sealed["passed"] is False and sealed["timeline"]["0"] == {"fetch": "Infinity", "repack": 0.5}
    op, finite = sealed["parity"]
    assert op["passed"] is False and op["value"] == "NaN" and op["detail"] == "value not finite"
    assert finite["name"] == FINITE_ROW and finite["passed"] is False and finite["value"] == 2
    _strict(canonical_bytes(sealed).decode())
    sealed["attempts"] = [{"seconds": float("-inf")}]  # a field added later: sealed again, counted too
    again = seal(sealed)
    assert again["attempts"] == [{"seconds": "-Infinity"}] and again["parity"][1]["value"] == 3
    assert "/attempts/0/seconds = -Infinity" in again["parity"][1]["detail"]
    assert seal(again) is again  # nothing new: unchanged
