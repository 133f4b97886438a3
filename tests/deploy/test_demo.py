"""The demo as a newcomer runs it: every step behaves, and it prints no warning it did not mean to show.

The only step allowed to show a refusal is the tamper step; no ``note:`` line appears anywhere else,
no Ray log line appears at all, and the bring-up's human output ends with its verdict line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: Ray's own log lines: "2026-12-05 02:29:55,419<TAB>WARNING authentication_token_setup.py:85 -- …".
RAY_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING|ERROR)\s+\S+\.py:\d+ --")
REFUSAL_STEP = "tamper with a stored blob"


def _steps(output: str) -> dict[str, list[str]]:
    """The demo's output split at its step rules (rich's ``──── title ────``)."""
    steps: dict[str, list[str]] = {"": []}
    current = ""
    for line in output.splitlines():
        rule = re.match(r"^─+ (.+?) ─+$", line.strip())
        if rule:
            current = rule.group(1)
            steps[current] = []
        else:
            steps[current].append(line)
    return steps


@pytest.mark.slow
def test_the_demo_prints_only_what_it_means_to(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SHARDPORT_"))}
    env["HOME"] = str(tmp_path / "home")  # Ray keeps its cluster token under the home folder
    env["COLUMNS"] = "200"  # rich wraps at the terminal width; a wide one keeps each line whole
    done = subprocess.run(
        [sys.executable, "-m", "shardport.deploy.demo", "--report", str(tmp_path / "report.html")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    ray_lines = [line for line in output.splitlines() if RAY_LOG.match(line)]
    assert not ray_lines, f"Ray's own log lines in the demo's output: {ray_lines}"
    steps = _steps(done.stdout)
    notes = {
        title: [line for line in lines if "note:" in line]
        for title, lines in steps.items()
        if not title.startswith(REFUSAL_STEP)
    }
    assert not {t: n for t, n in notes.items() if n}, f"notes outside the refusal step: {notes}"
    assert any(t.startswith(REFUSAL_STEP) for t in steps), list(steps)
    up = next(lines for title, lines in steps.items() if title.startswith("bring it up"))
    shown = [line for line in up if line.strip() and not line.startswith("(exit")]
    assert shown[-1].startswith("PASSED: "), shown[-6:]
    assert "signed evidence sha256:" in shown[-1] and "report.html" in shown[-1]
