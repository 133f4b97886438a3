"""``registry up``'s human output ends with the one line a person acts on."""

from __future__ import annotations

from typing import Any

from shardport.cli.bringup import render, verdict_line

DIGEST = "sha256:" + "ab" * 32
EVIDENCE = "sha256:" + "cd" * 32


def _result(**over: Any) -> dict[str, Any]:
    rows = [
        {"level": "L0", "name": "bytes", "passed": True, "value": 1, "tolerance": None},
        {"level": "L3", "name": "operator error", "passed": None, "value": None, "tolerance": None},
        {"level": "L4", "name": "top-1 agreement", "passed": True, "value": 5, "tolerance": 5},
    ]
    base = {
        "passed": True,
        "repository": "llama/q",
        "digest": DIGEST,
        "topology": {"tp": 2, "ep": 1, "pp": 1},
        "generated": [3, 4],
        "parity": rows,
        "timeline": {},
        "evidence": EVIDENCE,
        "report": "/tmp/out/report.html",
    }
    return base | over


def test_a_pass_ends_with_the_verdict_the_evidence_and_the_report() -> None:
    last = render(_result()).splitlines()[-1]
    assert last.startswith("PASSED: 2 of 3 parity rows measured")
    assert f"signed evidence {EVIDENCE}" in last
    assert f"registry evidence llama/q@{DIGEST} --show {EVIDENCE}" in last
    assert last.endswith("report /tmp/out/report.html")


def test_a_failure_names_the_failed_rows() -> None:
    result = _result(passed=False)
    result["parity"][2]["passed"] = False
    line = verdict_line(result)
    assert line.startswith("FAILED: L4 top-1 agreement — ")
    assert "L0" not in line.split(" — ")[0]


def test_without_evidence_or_report_it_says_so() -> None:
    line = verdict_line(_result(evidence=None, report=None))
    assert line.endswith("— no evidence stored")


def test_timeouts_beyond_a_week_are_refused_by_the_parser(capsys: Any) -> None:
    from shardport.cli import main
    from shardport.cli.parser import build_parser

    for flag in ("--connect-timeout", "--stage-timeout"):
        assert main(["--json", "up", "m:v1", "--tokens", "1", flag, "1e12"]) == 2
        assert "at most 604800" in capsys.readouterr().out
        assert build_parser().parse_args(["up", "m:v1", "--tokens", "1", flag, "3600"])
