"""``registry up --ladder full|sample|off``: the parity ladder's budget on a rank, and what the evidence says.

One rank of the tiny GGUF mix (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K; tied Q8_0 embedding) is loaded and
dispatched in-process, as a bring-up's rank does it (:class:`~shardport.deploy.rank.Rank`), then the
ladders run under each budget through :func:`~shardport.deploy.rank_ops.run_ladders`. The checkpoint
is pushed with ``--kernels-preferred cpu.int4pack``, so its Q4_0/Q4_1 weights are repacked in these
float32 runs (float32 is int4pack's slow path: without the preference the GGUF direct kernel runs them
in place, and L1 reads only the spot columns' values back through its matmul).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bringup_artifacts import gguf_tiny
from llama_artifacts import ok

from shardport.deploy.ladder_budget import ladder_mode
from shardport.deploy.quant_error import NAME as QUANT  # the L3 row measured at push, not by the ladder
from shardport.deploy.rank import Rank, RankSpec
from shardport.deploy.rank_ops import L3_TOKENS, run_ladders
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.report import render_report
from shardport.deploy.up import UpRequest, bring_up
from shardport.deploy.up_evidence import _ladder_rows, ladder_coverage
from shardport.kernels.int4_cpu import PreparedInt4
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.errors import UsageError
from shardport.registry.session import Session
from shardport.registry.trust.resolve import resolve

PROMPT = (1, 5, 300, 7)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The tiny GGUF pushed to a local store: (store, pinned reference)."""
    tmp = tmp_path_factory.mktemp("ladder")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDPORT_HOME", str(tmp / "home"))
        store = str(tmp / "store")
        ok(store, "keygen")
        ok(store, "push", gguf_tiny(tmp / "gguf"), "llama/gguf:v1", "--kernels-preferred", "cpu.int4pack")
        resolved = resolve(Session.open(store), parse_ref("llama/gguf:v1"))
        yield store, f"{resolved.ref.name}@{resolved.digest}"


def _rank(pushed: tuple[str, str], tp: int = 2, rank: int = 0) -> Rank:
    """One rank loaded and dispatched, its ladder not run (its planes kept for the ladders here)."""
    store, ref = pushed
    spec = RankSpec(
        ref=ref, store=store, home=os.environ["SHARDPORT_HOME"], s3_endpoint=None, tp=tp, ep=1, pp=1,
        rank=rank, fallback="warn", prompt=PROMPT, steps=1, threads=1, ladder="off", keep_planes=True,
    )  # fmt: skip
    r = Rank(spec)
    summary = r.prepare()
    assert "failure" not in summary, summary
    assert r.ops.ladders == [] and "ladder" not in r.timeline
    return r


def _ladders(r: Rank, mode: str) -> list[Any]:
    r.ops.ladders.clear()
    weights = {w.name: w for w in r.manifest.weights or []}
    run_ladders(r.loaded, weights, r.ops, mode=mode)
    return list(r.ops.ladders)


def _report(r: Rank, mode: str) -> dict[str, Any]:
    """The parts of a rank's report the ladder rows read."""
    return {
        "rank": r.spec.rank,
        "ladders": [lad.model_dump(mode="json") for lad in r.ops.ladders],
        "ladder_mode": mode,
        "dispatch": [t.model_dump(mode="json") for t in r.ops.traces],
    }


def test_sample_runs_l2_and_l3_once_per_class_and_full_on_every_weight(
    pushed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDPORT_HOME", str(Path(pushed[0]).parent / "home"))
    r = _rank(pushed)
    operators = {(name, op.kernel) for name, phases in r.ops.ops.items() for op in phases.values()}
    full = _ladders(r, "full")
    assert len(full) == len(operators) and all(lad.scope == "full" for lad in full)
    assert all(len(lad.l3) == len(L3_TOKENS) and lad.l2.reconstruction for lad in full)
    assert all(lad.passed for lad in full)

    sampled = _ladders(r, "sample")
    assert len(sampled) == len(operators)  # every operator has a ladder record
    classes = {lad.ladder_class for lad in sampled}
    reps = [lad for lad in sampled if lad.scope == "full"]
    assert len(reps) == len(classes) < len(sampled)  # L2 reconstruction + L3: once per class
    assert {lad.ladder_class for lad in reps} == classes
    by_weight = {lad.weight: lad for lad in reps}
    for lad in sampled:
        assert lad.passed and lad.l0.passed and lad.l1.passed
        if lad.scope == "sampled":
            rep = by_weight[lad.represented_by or ""]
            assert rep.ladder_class == lad.ladder_class and rep.kernel == lad.kernel
            assert rep.weight < lad.weight  # the first of its class by name
            assert lad.l3 == () and not lad.l2.reconstruction
    l1 = {lad.weight: lad.l1 for lad in sampled}
    assert set(l1) == {lad.weight for lad in full}  # L1 on every weight in both
    for lad in full:
        mine = l1[lad.weight]
        assert lad.l1.rows is None and lad.l1.codes_compared > 0  # every row on a full ladder
        if mine.rows is None:  # every code in both (int4pack's byte map; a class representative)
            assert mine.codes_compared == lad.l1.codes_compared
        else:  # a sampled direct kernel: the spot columns on every 8th row and the last
            assert mine.readback == "kernel-values" and mine.columns == lad.l1.columns
            assert mine.codes_compared == mine.rows * mine.columns < lad.l1.codes_compared
    # the Q4_0 linears of both layers share one class at tp 2 (same kernel, layout, tails): the first
    # by name represents them; Q4_K and Q6_K, and the embedding's 199-row tail, are classes of their own
    represented = {lad.weight.split("[")[0]: (lad.represented_by or "").split("[")[0] for lad in sampled}
    for name in ("blk.0.attn_q", "blk.0.ffn_gate", "blk.1.attn_k", "blk.1.attn_q", "blk.1.ffn_gate"):
        assert represented[f"{name}.weight"] == "blk.0.attn_k.weight"
    for name in ("blk.0.ffn_down", "blk.1.ffn_down", "token_embd", "blk.0.attn_k", "blk.0.attn_v"):
        assert represented[f"{name}.weight"] == ""
    coverage = ladder_coverage([_report(r, "sample")])
    assert coverage["full"] == len(classes) and coverage["sampled"] == len(sampled) - len(classes)
    assert not coverage["uncovered"] and not coverage["orphans"]
    assert sum(c["represents"] for c in coverage["classes"]) == coverage["sampled"]
    rows = _ladder_rows([_report(r, "sample")], r.loaded.digest)
    assert [row["level"] for row in rows] == ["L0", "L1", "L2", "L3"] and all(row["passed"] for row in rows)
    assert f"full ladder on {len(classes)} of {len(sampled)} operators" in rows[3]["detail"]


def test_sample_catches_a_mis_repacked_weight_that_is_not_a_representative(
    pushed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDPORT_HOME", str(Path(pushed[0]).parent / "home"))
    r = _rank(pushed)
    name = "blk.1.attn_q.weight"
    op = r.ops.ops[name]["decode"]
    assert isinstance(op, PreparedInt4)
    with torch.no_grad():
        op.packed.view(torch.uint8).view(-1)[5] ^= 0x11  # two codes of the packed layout changed
    ladders = {lad.weight.split("[")[0]: lad for lad in _ladders(r, "sample")}
    bad = ladders[name]
    assert bad.scope == "sampled" and bad.represented_by is not None
    assert not bad.l1.passed and bad.l1.mismatches >= 1 and bad.l1.first_mismatch
    assert ladders[bad.represented_by.split("[")[0]].passed  # its representative is fine
    rows = {row["level"]: row for row in _ladder_rows([_report(r, "sample")], r.loaded.digest)}
    assert not rows["L1"]["passed"] and rows["L1"]["value"] >= 1


def test_a_sampled_weight_is_proved_only_by_its_representative(
    pushed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDPORT_HOME", str(Path(pushed[0]).parent / "home"))
    r = _rank(pushed)
    _ladders(r, "sample")
    report = _report(r, "sample")
    rep = next(lad for lad in report["ladders"] if lad["scope"] == "full" and lad["ladder_class"] and any(
        s["represented_by"] == lad["weight"] for s in report["ladders"]
    ))  # fmt: skip
    rep["l3"][0]["passed"] = False  # the representative's L3 fails: its class is unproved
    coverage = ladder_coverage([report])
    assert coverage["failed_representatives"]
    rows = {row["level"]: row for row in _ladder_rows([report], r.loaded.digest)}
    assert (
        not rows["L2"]["passed"]
        and not rows["L3"]["passed"]
        and "representative failed" in rows["L3"]["detail"]
    )
    report["ladders"] = [lad for lad in report["ladders"] if lad is not rep]  # and when it is missing
    rows = {row["level"]: row for row in _ladder_rows([report], r.loaded.digest)}
    assert (
        not rows["L0"]["passed"] and not rows["L2"]["passed"] and "no representative" in rows["L2"]["detail"]
    )


def test_off_runs_no_ladder_and_the_evidence_says_not_run(
    pushed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDPORT_HOME", str(Path(pushed[0]).parent / "home"))
    store, ref = pushed
    request = UpRequest(ref=ref, tokens=PROMPT, steps=2, store=store, ladder="off")
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    assert result.reports[0]["ladders"] == [] and "ladder" not in result.reports[0]["timeline"]
    pred = result.predicate
    ladder = [r for r in pred["parity"] if r["level"] in ("L0", "L1", "L2", "L3") and r["name"] != QUANT]
    rows = {row["level"]: row for row in ladder}
    assert len(rows) == 4
    assert all(row["passed"] is None and row["status"] == "not run" for row in rows.values())
    assert pred["ladder"]["mode"] == "off" and pred["ladder"]["operators"] == 0
    assert pred["passed"]  # L4 and L5 ran and hold; L0-L3 are recorded as not run, not as passed
    page = render_report(pred)
    assert "not run" in page and "were not run" in page
    assert ladder_mode(True) == "full" and ladder_mode(False) == "off"
    with pytest.raises(UsageError, match="--ladder 'most'"):
        bring_up(Session.open(store), UpRequest(ref=ref, tokens=PROMPT, store=store, ladder="most"))  # type: ignore[arg-type]
