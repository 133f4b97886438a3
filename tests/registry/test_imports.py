"""The registry commands never import torch or Ray (a pull must start fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import make_checkpoint

SCRIPT = r"""
import json, sys, tempfile, pathlib, contextlib, io
sys.path.insert(0, {tests!r})
from support import make_checkpoint
from shardport.cli import run
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


CHILD = r"""
import contextlib, io, json, sys
from shardport.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
HEAVY = {"numpy", "pydantic", "gguf", "fsspec", "torch", "ray", "safetensors", "cryptography"}


def _imports(*argv: str | Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``registry ARGV``."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, argv)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, out.stdout + out.stderr
    return set(doc["modules"])


def _packages(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_heavy_package() -> None:
    """``registry --help`` builds the parser only: nothing beyond the standard library is imported."""
    assert _packages(_imports("--help")) & HEAVY == set()
    assert _packages(_imports("push", "--help")) & HEAVY == set()


def test_commands_that_parse_no_checkpoint_load_no_decoder(tmp_path: Path) -> None:
    """log/ls read tag documents only (no pydantic); tag/rollback/inspect read a manifest (pydantic)
    but none of them loads numpy, gguf, the container gates or the contract decoders, nor (on a local
    store) fsspec."""
    env = {**os.environ, "SHARDPORT_HOME": str(tmp_path / "home")}
    env.pop("SHARDPORT_STORE", None)
    store = ("--store", str(tmp_path / "store"))
    _imports(*store, "keygen", env=env)
    for seed in (1, 2):  # two versions with different targets, for rollback
        _imports(
            *store, "push", make_checkpoint(tmp_path / f"c{seed}", seed=seed, size=1000), "a/b:c", env=env
        )
    never = {"numpy", "gguf", "torch", "ray", "safetensors", "fsspec"}
    gates = {
        "shardport.registry.formats.safetensors_gate",
        "shardport.registry.formats.gguf_gate",
        "shardport.registry.contracts.decode",
    }
    for argv in (["log", "a/b:c"], ["ls"]):
        found = _imports(*store, *argv, env=env)
        assert _packages(found) & (never | {"pydantic"}) == set(), argv
    for argv in (["tag", "a/b:c", "a/b:d"], ["rollback", "a/b:c", "--steps", "1"], ["inspect", "a/b:c"]):
        found = _imports(*store, *argv, env=env)
        assert _packages(found) & never == set() and found & gates == set(), (argv, found & gates)
