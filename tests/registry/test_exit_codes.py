"""Every exit code of the table, triggered through the real CLI with ``--json``: code and error type.

Also the three declarations that used to escape as raw tracebacks (a declared permutation plane, a
1-D compressed-tensors ``weight_scale``, a U8 ``weight_packed``), and the last line of defence: an
exception nobody anticipated becomes ``InternalError`` (exit 70) with its traceback in a file.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import cryptography.hazmat.primitives.asymmetric.ed25519 as ed25519
import numpy as np
import pytest
from quantized import gptq_planes, make_quantized
from safetensors.numpy import save_file
from support import REGISTRY, make_checkpoint

import shardport
from shardport import EXIT_CODES, ShardportError
from shardport.cli import build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
PREFIX = "model.layers.0.mlp.down_proj"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "checkpoint_format": "gptq"}


class Registry:
    """``registry --store STORE --json ...`` through :func:`shardport.cli.main` (the console script)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], store: str) -> None:
        self.capsys = capsys
        self.store = store

    def __call__(self, *args: str | Path, store: str | None = None) -> tuple[int, Any]:
        self.capsys.readouterr()
        code = main(["--store", store or self.store, "--json", *map(str, args)])
        out = self.capsys.readouterr().out
        return code, json.loads(out)

    def error(self, expected_code: int, expected_type: str, *args: str | Path) -> dict[str, Any]:
        code, out = self(*args)
        assert (code, out.get("error", {}).get("type")) == (expected_code, expected_type), out
        assert out["error"]["exit_code"] == code
        return dict(out["error"])


@pytest.fixture
def registry(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Registry:
    cli = Registry(capsys, str(tmp_path / "store"))
    assert cli("keygen")[0] == 0
    return cli


@pytest.fixture
def pushed(registry: Registry, tmp_path: Path) -> str:
    code, out = registry("push", make_checkpoint(tmp_path / "ck", size=2_000, files=1), "m/x:1")
    assert code == 0, out
    return str(out["digest"])


def test_0_ok(registry: Registry, pushed: str) -> None:
    code, out = registry("log", "m/x:1")
    assert code == 0 and out[0]["target"] == pushed


def test_1_verification_failed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry(capsys, str(tmp_path / "store"))  # no key: the push is unsigned
    ck = make_checkpoint(tmp_path / "ck", size=2_000, files=1)
    assert registry("push", ck, "m/u:1", "--allow-unsigned")[0] == 0
    registry.error(1, "UnsignedError", "pull", "m/u:1", tmp_path / "dest")


def test_2_usage(registry: Registry, tmp_path: Path) -> None:
    registry.error(2, "UsageError", "log", "not a ref!")
    # argparse's own refusals are usage errors too, as JSON under --json
    error = registry.error(2, "UsageError", "push", tmp_path, "m/x:1", "--retry", "many")
    assert "--retry" in error["message"]
    registry.error(2, "UsageError", "no-such-command")
    registry.error(2, "KeyFormatError", "ls", "--key", tmp_path / "missing.key")  # a key file the user named
    for grace in ("nan", "inf", "-1", "1e308"):  # tracebacks before; a negative grace deletes pushes
        registry.error(2, "UsageError", "gc", "--grace-seconds", grace)
    (tmp_path / "a-file").write_text("not a store")
    code, out = registry("ls", store=str(tmp_path / "a-file"))
    assert (code, out["error"]["type"]) == (2, "UsageError") and "a-file" in out["error"]["message"]


def test_3_not_found(registry: Registry, pushed: str) -> None:
    registry.error(3, "NotFoundError", "log", "m/nothing:1")


def test_4_conflict(registry: Registry, pushed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer creates the tag's next version between our read and our create-only write.

    The competing write happens inside the operating system's ``link`` (the local create-only
    primitive), so the conflict is detected by the real code path; no component of ours is replaced.
    """
    real_link = os.link

    def racing_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if "/tags/" in str(dst) and not Path(dst).exists():
            Path(dst).write_bytes(b"another writer's document")
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", racing_link)
    error = registry.error(4, "TagMovedError", "tag", "m/x:1", "m/x:2")
    assert "--retry" in error["message"]


def test_5_refused_container(registry: Registry, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    save_file({"w": np.ones((4, 4), dtype=np.float32)}, str(folder / "model.safetensors"))
    blob = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(blob[:-8])  # the tensor runs past the end
    registry.error(5, "TensorOutOfBoundsError", "push", folder, "m/bad:1")
    code, report = registry("verify", folder)
    assert code == 5 and report["findings"][0]["kind"] == "TensorOutOfBoundsError"


def _gptq(folder: Path) -> None:
    planes = gptq_planes(make_quantized(n=64, k=128, group_size=32), PREFIX)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in planes.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "quantization_config": GPTQ}
    (folder / "config.json").write_text(json.dumps(config))


def _compressed_tensors(folder: Path, *, scale: tuple[int, ...], packed: np.ndarray) -> None:
    planes = {
        f"{PREFIX}.weight_packed": packed,
        f"{PREFIX}.weight_scale": np.ones(scale, dtype=np.float16),
        f"{PREFIX}.weight_shape": np.array([64, 128], dtype=np.int64),
    }
    folder.mkdir(parents=True)
    save_file(planes, str(folder / "model.safetensors"))
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        },
    }
    (folder / "config.json").write_text(json.dumps(config))


def test_5_refused_declared_permutation_plane(registry: Registry, tmp_path: Path) -> None:
    _gptq(tmp_path / "q")
    perm = {
        "kind": "plane",
        "plane": f"{PREFIX}.g_idx",
        "physical_dtype": "I32",
        "physical_shape": [128],
        "direction": "logical_to_stored",
    }
    declare = {"weights": {f"{PREFIX}.weight": {"permutation": {**perm, "axis": "K"}}}}
    error = registry.error(
        5, "DeclaredPlaneError", "push", tmp_path / "q", "m/q:1", "--declare", json.dumps(declare)
    )
    assert f"{PREFIX}.weight" in error["message"] and "g_idx" in error["message"]
    assert "expected" in error["message"] and "found" in error["message"]
    missing = {"weights": {f"{PREFIX}.weight": {"permutation": {**perm, "plane": "nowhere", "axis": "K"}}}}
    error = registry.error(
        5, "DeclaredPlaneError", "push", tmp_path / "q", "m/q:1", "--declare", json.dumps(missing)
    )
    assert "nowhere" in error["message"] and "not one of its tensors" in error["message"]
    assert registry("ls")[1] == []  # nothing was tagged


def test_5_refused_one_dimensional_weight_scale(registry: Registry, tmp_path: Path) -> None:
    _compressed_tensors(tmp_path / "q", scale=(64,), packed=np.zeros((64, 16), dtype=np.int32))
    error = registry.error(5, "PlaneRankError", "push", tmp_path / "q", "m/q:1")
    assert f"{PREFIX}.weight_scale" in error["message"] and "expected 2 dimension(s)" in error["message"]
    assert "found 1 dimension(s) [64]" in error["message"]


def test_5_refused_u8_weight_packed(registry: Registry, tmp_path: Path) -> None:
    _compressed_tensors(tmp_path / "q", scale=(64, 4), packed=np.zeros((64, 64), dtype=np.uint8))
    error = registry.error(5, "PlaneDtypeError", "push", tmp_path / "q", "m/q:1")
    assert f"{PREFIX}.weight_packed" in error["message"] and "expected I32, found U8" in error["message"]
    # the same checkpoint with int32 containers is accepted
    _compressed_tensors(tmp_path / "ok", scale=(64, 4), packed=np.zeros((64, 16), dtype=np.int32))
    assert registry("push", tmp_path / "ok", "m/q:1")[0] == 0


def test_6_storage_failed(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 store whose endpoint does not answer (a port on 127.0.0.1 nobody listens on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    code, out = registry("--s3-endpoint", f"http://127.0.0.1:{port}", "ls", store="s3://bucket/registry")
    assert (code, out["error"]["type"]) == (6, "StoreError"), out


def test_70_internal_error_writes_its_traceback(
    registry: Registry, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A library failing in a way nobody anticipated: reported as InternalError, never a traceback."""

    def broken() -> None:
        raise RuntimeError("entropy source unavailable")

    monkeypatch.setattr(ed25519.Ed25519PrivateKey, "generate", staticmethod(broken))
    error = registry.error(70, "InternalError", "keygen", "--name", "second")
    path = Path(error["traceback_file"])
    assert path.parent == home / "logs" and str(path) in error["message"]
    text = path.read_text()
    assert "RuntimeError: entropy source unavailable" in text and "Traceback" in text
    assert "keygen --name second" in text
    # human mode: one line on stderr naming the file, same exit code
    assert main(["--store", registry.store, "keygen", "--name", "third"]) == 70
    err = capsys.readouterr().err
    assert "InternalError" not in err and "unexpected RuntimeError" in err and "Traceback" not in err
    found = re.search(r"the traceback is in (\S+);", err)
    assert found is not None and Path(found.group(1)).is_file()


def _error_classes() -> list[type[ShardportError]]:
    for package in ("registry", "placement", "loader", "provenance"):
        module = importlib.import_module(f"shardport.{package}")
        for info in pkgutil.walk_packages(module.__path__, f"shardport.{package}."):
            if info.name.rsplit(".", 1)[-1] == "errors":
                importlib.import_module(info.name)
    seen: list[type[ShardportError]] = []
    todo: list[type[ShardportError]] = [ShardportError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return seen


def test_every_error_class_uses_a_code_of_the_table() -> None:
    for cls in _error_classes():
        assert cls.exit_code in EXIT_CODES, f"{cls.__module__}.{cls.__name__}: exit code {cls.exit_code}"
    assert shardport.EXIT_CODES is EXIT_CODES


def test_exit_code_table_in_readme_and_help() -> None:
    readme = README.read_text()
    epilog = build_parser().epilog or ""
    for code, meaning in EXIT_CODES.items():
        assert re.search(rf"^\| *{code} *\|", readme, re.MULTILINE), f"README table lacks exit code {code}"
        assert f"{code} {meaning.split(':')[0]}" in epilog


def test_config_counts_are_checked_before_anything_is_built(registry: Registry, tmp_path: Path) -> None:
    """config.json is untrusted: a huge layer count must not make push enumerate its slots (memory),
    and a layer count that is not a count is refused with a named error."""
    folder = tmp_path / "f"
    folder.mkdir()
    save_file({"model.norm.weight": np.ones(8, dtype=np.float16)}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 10**15}
    (folder / "config.json").write_text(json.dumps(config))
    code, out = registry("push", folder, "m/f:1")
    assert code == 0, out
    error = registry.error(5, "InventoryMismatchError", "push", folder, "m/f:2", "--strict")
    assert str(10**15) in error["message"]
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "32"}))
    error = registry.error(5, "InventoryMismatchError", "push", folder, "m/f:3")
    assert "num_hidden_layers" in error["message"] and "'32'" in error["message"]


def test_a_reader_that_goes_away_is_not_a_traceback(registry: Registry, pushed: str) -> None:
    """``registry inspect REF | head -1``: the pipe closes before the output is written."""
    child = subprocess.Popen(
        [REGISTRY, "--store", registry.store, "inspect", "m/x:1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child has started: its write meets a closed pipe
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and "Traceback" not in err, err
