"""The bring-up HTML report, rendered in a real browser (Debian's headless Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shardport.deploy.report import render_report, write_report

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
            {"rank": r, "weight": "model.layers.0.mlp.up_proj", "phase": "decode", "kernel": "cpu-int4pack",
             "transformation": "repack"}
            for r in (0, 1)
        ],
        "timeline": {"0": {"resolve": 0.1, "fetch": 0.4, "repack": 0.2}, "1": {"resolve": 0.1, "fetch": 0.5}},
        "ledger": {"0": {"codes": 4 << 20, "qparams": 1 << 20}, "1": {"codes": 4 << 20, "kv_cache": 2 << 20}},
    }


def browse(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None, "no headless Chromium: scripts/test.sh installs chromium-headless-shell"
    return subprocess.run(
        [BROWSER, *FLAGS, "--enable-logging=stderr", "--v=0", *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
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
