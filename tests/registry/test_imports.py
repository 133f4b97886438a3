"""The registry commands never import torch or Ray (a pull must start fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import json, sys, tempfile, pathlib, contextlib, io
sys.path.insert(0, {tests!r})
from support import make_checkpoint
from shardport.registry.cli import run
tmp = pathlib.Path(tempfile.mkdtemp())
import os
os.environ["SHARDPORT_HOME"] = str(tmp / "home")
store = str(tmp / "store")
with contextlib.redirect_stdout(io.StringIO()):
    assert run(["--store", store, "keygen"]) == 0
    assert run(["--store", store, "push", str(make_checkpoint(tmp / "c")), "a/b:c"]) == 0
    assert run(["--store", store, "pull", "a/b:c", str(tmp / "d")]) == 0
    assert run(["--store", store, "verify", "a/b:c"]) == 0
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray"))))
"""


def test_registry_commands_do_not_import_torch_or_ray() -> None:
    tests = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
