"""Test support: checkpoints to push, and the ``registry`` CLI run in-process or as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardport.cli import run

REGISTRY = str(Path(sys.executable).parent / "registry")


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str], store: str) -> None:
        self.capsys = capsys
        self.store = store

    def __call__(self, *args: str | Path) -> tuple[int, Any]:
        self.capsys.readouterr()
        code = run(["--store", self.store, "--json", *map(str, args)])
        out = self.capsys.readouterr().out
        return code, json.loads(out)

    def ok(self, *args: str | Path) -> Any:
        code, out = self(*args)
        assert code == 0, out
        return out


def subprocess_cli(
    store: str, *args: str | Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REGISTRY, "--store", store, "--json", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def make_checkpoint(root: Path, *, seed: int = 0, size: int = 200_000, files: int = 3) -> Path:
    """A small checkpoint folder: config, tokenizer, and random 'shards'."""
    import random

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64}'
    )
    (root / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    for i in range(files):
        (root / f"model-{i:05d}.bin").write_bytes(rng.randbytes(size))
    return root
