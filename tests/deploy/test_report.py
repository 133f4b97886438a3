"""The bring-up HTML report, rendered in a real browser (Debian's headless Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shardport.deploy.report import level_lines, render_report, write_report

BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def evidence() -> dict[str, object]:
    return {
        "repository": "acme/llama",
        "manifest": "sha256:" + "ab" * 32,
        "tag": {"version": 3, "digest": "sha256:" + "cd" * 32},
        "topology": {"tp": 2, "ep": 1, "pp": 1},
        "created": "2026-12-01T00:00:00Z",
        "passed": True,
        "parity": [
            {"level": "L3", "name": "operator", "passed": True, "value": 1e-6, "tolerance": 1e-4},
            {"level": "L4", "name": "graph <script>alert(1)</script>", "passed": False, "value": 0.5},
        ],
        "dispatch": [
            {
                "rank": r,
                "weight": "model.layers.0.mlp.up_proj",
                "phase": "decode",
                "kernel": "cpu-int4pack",
                "transformation": "repack",
            }
            for r in (0, 1)
        ],
        "timeline": {"0": {"resolve": 0.1, "fetch": 0.4, "repack": 0.2}, "1": {"resolve": 0.1, "fetch": 0.5}},
        "ledger": {"0": {"codes": 4 << 20, "qparams": 1 << 20}, "1": {"codes": 4 << 20, "kv_cache": 2 << 20}},
    }


def browse(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None, "no headless Chromium: scripts/test.sh installs chromium-headless-shell"
    return subprocess.run(
        [BROWSER, *FLAGS, "--enable-logging=stderr", "--v=0", *extra, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_report_draws_charts_without_script_errors(tmp_path: Path) -> None:
    page = write_report(evidence(), tmp_path / "report.html")
    dom = browse(page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-charts="drawn"' in dom.stdout
    # 5 timeline segments + 4 memory segments, one mark each.
    assert len(re.findall(r'<rect[^>]*class="mark"', dom.stdout)) == 9
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    # Data is text, never markup: the injected tag is escaped in the table and in the embedded JSON.
    assert "<script>alert(1)</script>" not in render_report(evidence())
    shot = tmp_path / "report.png"
    done = browse(page, f"--screenshot={shot}", "--window-size=1280,1400")
    assert done.returncode == 0 and shot.stat().st_size > 10_000


def test_report_without_data_says_so() -> None:
    text = render_report({})
    assert "no parity results" in text and "no dispatch trace" in text


@pytest.mark.slow
def test_report_draws_charts_around_non_finite_measures(tmp_path: Path) -> None:
    data = evidence()
    data["timeline"] = {"0": {"resolve": 0.1, "fetch": "NaN"}, "1": {"resolve": 0.1, "fetch": float("inf")}}
    data["ledger"] = {"0": {"codes": float("nan")}, "1": {"codes": 4 << 20}}  # an unsealed NaN, too
    page = write_report(data, tmp_path / "report.html")
    embedded = re.search(r'id="evidence-data">(.*?)</script>', page.read_text(), re.S)
    assert embedded is not None
    strict = json.loads(embedded.group(1), parse_constant=lambda c: pytest.fail(f"bare {c} in the page"))
    assert strict["timeline"]["1"]["fetch"] == "Infinity" and strict["ledger"]["0"]["codes"] == "NaN"
    dom = browse(page, "--dump-dom")
    assert 'data-charts="drawn"' in dom.stdout, dom.stderr[-2000:]
    assert len(re.findall(r'<rect[^>]*class="mark"', dom.stdout)) == 3  # the finite segments only
    assert dom.stdout.count("(not finite: fetch)") == 2 and "(not finite: codes)" in dom.stdout
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []


#: A real predicate of ``registry up`` (``gptq_tiny``: 2 layers, tp 3, ``--ladder sample``, float32 on
#: CPU), with ``parity_l3`` added from the same run's rank ladders (one record per operator that ran L3:
#: the field the report reads, not yet written by the bring-up).
REAL = Path(__file__).parents[1] / "vectors" / "report" / "bringup-gptq-tp3.json"


def _relayer(name: str, layer: int) -> str:
    return re.sub(r"(?<=\.)1(?=\.)", str(layer), name, count=1)


def scaled(layers: int) -> dict[str, Any]:
    """The real predicate grown to ``layers`` layers: layer 1's traces, ladder records and covered
    weights repeated for layers 2.. (a 135M-class llama: 30 layers of 7 linears; at tp 3 and two
    phases, 1,260 dispatch traces and 630 ladders)."""
    pred: dict[str, Any] = json.loads(REAL.read_text())

    def grow(rows: list[Any], name: Any) -> list[Any]:
        extra = [
            _relayer_row(row, name, layer)
            for layer in range(2, layers)
            for row in rows
            if ".layers.1." in str(name(row))
        ]
        return rows + extra

    pred["dispatch"] = grow(pred["dispatch"], lambda r: r["weight"])
    pred["parity_l3"] = grow(pred["parity_l3"], lambda r: r["weight"])
    for cls in pred["ladder"]["classes"]:
        cls["covered"] = grow(cls["covered"], lambda w: w)
        cls["represents"] = len(cls["covered"])
    covered = sum(c["represents"] for c in pred["ladder"]["classes"])
    pred["ladder"].update(sampled=covered, operators=covered + pred["ladder"]["full"])
    return pred


def _relayer_row(row: Any, name: Any, layer: int) -> Any:
    if isinstance(row, str):
        return _relayer(row, layer)
    return {**row, "weight": _relayer(row["weight"], layer)}


def test_a_135m_class_report_is_under_200_kb_and_opens_with_the_verdict() -> None:
    pred = scaled(30)
    assert len(pred["dispatch"]) == 30 * 7 * 3 * 2 and pred["ladder"]["operators"] == 30 * 7 * 3
    page = render_report(pred)
    size = len(page.encode("utf-8"))
    assert size < 200_000, size  # measured: 21 KB (with the whole predicate embedded: ~500 KB)
    first = page.index("<h1>")
    assert page.index("PASSED") < page.index("<h2>") and first < page.index("<h2>")
    levels = [page.index(f"<td><b>{lv}</b></td>") for lv in ("L0", "L1", "L2", "L3", "L4", "L5")]
    assert levels == sorted(levels) and levels[-1] < page.index("<h2>")
    assert pred["manifest"] in page[: page.index("<h2>")] and "tp=3 ep=1 pp=1" in page
    # the dispatch: one kernel-mix row per weight class (the three ranks agree), every trace behind
    # a collapsed <details> as a legend and a grid of layers (30 identical layers: one row per rank)
    mix = page[page.index("<h2>Dispatch</h2>") : page.index("<details><summary>every trace")]
    assert mix.count("<tr>") == 1 + 7 and mix.count("<td>0-2</td>") == 7
    assert "<details open" not in page and "cpu.int4-direct@1 \u00d760" in mix
    legend = re.findall(r"<tr><td><b>([A-Z]+)</b></td>(?:<td>[^<]*</td>){4}<td>(\d+)</td>", page)
    assert sum(int(n) for _, n in legend) == len(pred["dispatch"])
    assert page.count("<td>0-29</td>") == 3  # one grid row per rank
    # no raw lists of weight names: the covered weights are folded by layer
    assert page.count("model.layers.") < 120, page.count("model.layers.")
    assert "model.layers.{0-29}.mlp.up_proj.weight[N=0:256, K=0:192]" in page


def test_each_level_line_gives_its_status_and_deciding_value() -> None:
    parity = [
        {"level": "L0", "name": "bytes", "status": "pass", "passed": True, "value": 8, "tolerance": None},
        {"level": "L2", "name": "decode", "status": "not applicable", "passed": None,
         "detail": "float model"},
        {"level": "L3", "name": "max E_kernel", "passed": None, "status": "not run",
         "detail": "--ladder off"},
        {"level": "L4", "name": "logits", "passed": True, "value": 0.01, "tolerance": 0.1,
         "tolerance_source": "64 · E · (layers + 1)"},
        {"level": "L4", "name": "top-1", "passed": False, "value": 3, "tolerance": 4},
        {"level": "L5", "name": "kernels", "passed": True, "value": 84, "tolerance": None},
        {"level": "L5", "name": "memory", "passed": True, "value": 5.0, "tolerance": 9.0},
    ]  # fmt: skip
    lines = {lv: (state, line) for lv, state, line in level_lines(parity)}
    assert lines["L0"] == ("pass", "1 of 1 checks pass; bytes: 8")
    assert lines["L1"] == ("not run", "no checks in this evidence")
    assert lines["L2"] == ("not applicable", "0 of 1 checks pass; float model")
    assert lines["L3"] == ("not run", "0 of 1 checks pass; --ladder off")
    assert lines["L4"] == ("fail", "1 of 2 checks pass; top-1: 3 vs tolerance 4")
    assert lines["L5"] == ("pass", "2 of 2 checks pass; memory: 5 vs tolerance 9")
    page = render_report({"passed": False, "parity": parity})
    assert '<span class="verdict fail">FAILED</span>' in page
    assert "<th>tolerance_source</th>" in page and "64 · E · (layers + 1)" in page


def _bars(svg_class: str, page: str) -> list[str]:
    return re.findall(rf'<rect class="{svg_class}"[^>]*fill="(#[0-9a-f]+)"', page)


def test_the_l4_chart_draws_every_position_and_step_against_the_tolerance() -> None:
    parity = {"tolerance": 0.01, "max_abs_diff": 0.02, "decode_max_abs_diff": 0.004,
              "per_position_abs_diff": [0.001, 0.02, "NaN", 0.0], "decode_per_step_abs_diff": [0.004, 0.003],
              "reference": {"kind": "hf-transformers"}}  # fmt: skip
    page = render_report({"parity_l4": parity})
    # three finite prompt positions (one over the tolerance: red) and two decode steps; the NaN named
    assert _bars("l4", page) == ["#4e79a7", "#b42318", "#4e79a7", "#f28e2b", "#f28e2b"]
    assert page.count('class="l4-tol"') == 6 and "not finite: 2" in page
    assert "(kind=hf-transformers)" in page and "Only the maxima" not in page
    only = {"tolerance": 0.01, "max_abs_diff": 0.002, "decode_max_abs_diff": 0.02}
    maxima = render_report({"parity_l4": only})
    assert _bars("l4", maxima) == ["#4e79a7", "#b42318"] and "Only the maxima" in maxima


def test_the_l3_chart_draws_the_worst_operator_of_each_layer() -> None:
    def ladder(weight: str, *errors: object, passed: bool = True) -> dict[str, Any]:
        batches = [{"e_kernel": e, "tol_kernel": 1e-5, "e_conversion": 0.0, "passed": passed} for e in errors]
        return {"weight": weight, "l3": batches}

    ladders = [
        ladder("blk.0.attn_q.weight", 1e-7, 3e-7),
        ladder("blk.0.ffn_up.weight", 2e-6),
        ladder("blk.1.attn_q.weight", 4e-5, passed=False),
        ladder("blk.2.attn_q.weight", "NaN"),
        ladder("token_embd.weight", 5e-8),
    ]
    page = render_report({"ladders": ladders})
    # layers 0 and 1, then the embedding (its own slot); layer 2's NaN drawn as nothing and named
    assert _bars("l3", page) == ["#4e79a7", "#b42318", "#4e79a7"] and "not finite: 2" in page
    assert "layer 0: max E_kernel 2e-06, tolerance 1e-05, 2 operators" in page
    pred = scaled(30)
    assert "No per-operator L3 records" not in render_report(pred)
    assert "No per-operator L3 records" in render_report({k: v for k, v in pred.items() if k != "parity_l3"})


@pytest.mark.slow
def test_a_135m_class_report_renders_without_script_errors(tmp_path: Path) -> None:
    pred = scaled(30)
    page = write_report(pred, tmp_path / "report.html")
    dom = browse(page, "--dump-dom")
    assert dom.returncode == 0 and 'data-charts="drawn"' in dom.stdout, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []
    stages = sum(len(t) for t in pred["timeline"].values()) + sum(
        1 for parts in pred["ledger"].values() for v in parts.values() if v
    )
    assert len(re.findall(r'<rect[^>]*class="mark"', dom.stdout)) == stages
    assert len(_bars("l3", dom.stdout)) == 1 and len(_bars("l4", dom.stdout)) == 2  # layer 0; the maxima
    assert dom.stdout.count("<details>") == 2 and "<details open" not in dom.stdout


def test_dispatch_detail_keeps_every_trace_with_its_candidates_and_summary() -> None:
    refused = {
        "kernel": "cpu.int4pack@1",
        "selected": False,
        "note": None,
        "admission": {"accepted": False, "refusals": [{"reason": "group_size"}]},
    }
    chosen = {"kernel": "cpu.int4-direct@1", "selected": True,
              "admission": {"accepted": True, "refusals": []}}  # fmt: skip
    dispatch = [
        {
            "rank": rank,
            "weight": f"blk.{layer}.attn_q.weight",
            "phase": phase,
            "kernel": "cpu.int4-direct@1",
            "transformation": "none",
            "activations": "float32",
            "path": "slow" if layer == 1 else "fast",
            "candidates": [refused, chosen],
        }
        for rank in (0, 1)
        for layer in range(3)
        for phase in ("prefill", "decode")
    ] + [{"rank": 0, "weight": "token_embd.weight", "phase": "decode", "kernel": "cpu.gguf-direct@1"}]
    summary = {"traces": 13, "kernels": {"cpu.int4-direct@1": 12, "cpu.gguf-direct@1": 1}}
    page = render_report({"dispatch": dispatch, "dispatch_summary": summary})
    assert "cpu.int4pack@1: refused (group_size); cpu.int4-direct@1: selected" in page
    row = r"<tr><td><b>([A-Z]+)</b></td>(?:<td>[^<]*</td>){3}<td[^>]*>([a-z-]+)</td><td>(\d+)</td>"
    legend = re.findall(row, page)
    assert legend == [("A", "fast", "8"), ("B", "slow", "4"), ("C", "-", "1")]
    grid = "<tr><td>0</td><td>A</td></tr><tr><td>1</td><td>B</td></tr><tr><td>2</td><td>A</td></tr>"
    assert page.count(grid) == 2  # per rank: layer 1 ran the slow path, so nothing folds
    assert "<tr><td>token_embd.weight</td><td>-/C</td></tr>" in page  # no layer: listed apart; no prefill
    assert "<td>13</td><td>cpu.int4-direct@1=12 cpu.gguf-direct@1=1</td>" in page  # the summary as it comes


def test_placement_candidates_and_ladder_values_render_when_present() -> None:
    refusal = "group_size: expected 128, found 64"
    groups = [
        {"rank": rank, "weight_class": "affine:u4/g64", "phase": phase, "weights": 30,
         "selected": {"cpu.int4-direct@1": 30}, "activations": ["float32"],
         "candidates": [{"kernel": "cpu.int4pack@1", "admitted": 0, "prepared": 0, "selected": 0,
                         "reasons": [refusal]},
                        {"kernel": "cpu.int4-direct@1", "admitted": 30, "prepared": 30, "selected": 30,
                         "reasons": []}]}
        for rank in (0, 1, 2) for phase in ("prefill", "decode")
    ]  # fmt: skip
    plan = {"plan_sha256": "sha256:" + "11" * 32, "decisions": "sha256:" + "22" * 32, "agree": False}
    pred = {
        **scaled(2),
        "placement": plan,
        "reference": {"kind": "transformers", "version": "4.57.1", "class": "LlamaForCausalLM"},
        "dispatch_candidates": groups,
        "ladder_values": {"sha256": "sha256:" + "33" * 32, "operators": 42, "blob": None},
    }
    page = render_report(pred)
    head = page[: page.index("<h2>")]
    assert "sha256:" + "11" * 32 in head and "the ranks&#x27; plans DISAGREE" in head
    assert "(kind=transformers version=4.57.1 class=LlamaForCausalLM)" in page
    folded = r"<tr><td>0-2</td><td>prefill, decode</td><td><code>affine:u4/g64</code></td>.*?</tr>"
    row = re.search(folded, page)  # three ranks, two phases: one row
    assert row is not None
    assert f"cpu.int4pack@1: admitted 0, prepared 0, selected 0 (refused: {refusal})" in row[0]
    assert "Per-operator ladder values: 42 operators, sha256:" + "33" * 32 in page


def test_fields_of_another_shape_read_as_missing() -> None:
    """Evidence written by another version: any top-level field of an unexpected shape still renders."""
    base = scaled(2)
    base["ladders"] = [{"weight": "model.layers.1.mlp.up_proj.weight", "l3": [{"e_kernel": 1e-7}]}]
    base["dispatch_candidates"] = [{"rank": 0, "candidates": [{"kernel": "k", "reasons": ["r"]}]}]
    for key in [*base, "placement", "plan_digest", "dispatch_summary", "conversion_errors", "ladder_values"]:
        for odd in (None, "x", 3, [1, None], {"a": None}, [{}]):
            page = render_report({**base, key: odd})
            assert page.endswith("</body></html>\n") and "<h1>" in page, (key, odd)
