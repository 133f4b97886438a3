"""``push --kernels-required/--kernels-preferred`` record kernel ids in the manifest's runtime section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import Cli

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.store.protocol import Store


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"lm_head.weight": np.ones((4, 8), np.float16)}, str(folder / "model.safetensors"))
    return folder


def test_kernel_ids_are_recorded_in_runtime(cli: Cli, tmp_path: Path) -> None:
    out = cli.ok(
        "push",
        _folder(tmp_path),
        "m:v1",
        "--kernels-required",
        "cpu.int4pack@1, reference",
        "--kernels-preferred",
        "cpu.int4pack",
    )
    digest = out["digest"]
    manifest = Manifest.from_bytes(Store(cli.store).read_blob(digest))
    assert manifest.runtime.kernels_required == ["cpu.int4pack@1", "reference"]
    assert manifest.runtime.kernels_preferred == ["cpu.int4pack"]


@pytest.mark.parametrize("bad", ["CPU Int4", "a,a", "@1"])
def test_bad_kernel_ids_are_usage_errors(cli: Cli, tmp_path: Path, bad: str) -> None:
    code, out = cli("push", _folder(tmp_path), "m:v1", "--kernels-required", bad)
    assert code == 2 and "--kernels-required" in out["error"]["message"]
