"""Rank and node pulls write like the full pull: staged in DEST, never through a link, all or nothing.

Issue 15: a link planted at ``DEST/rank-00000.ledger.json`` made a rank pull overwrite the file it
pointed to, and a failed rank pull left partial files behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from llama_artifacts import cli, ok
from loader_artifacts import llama_arrays
from safetensors.numpy import save_file
from support import REGISTRY

from shardport.registry.output.staging import temp_name

REF = "m/s:1"
RANK0 = ("rank-00000-of-00002.safetensors", "rank-00000.plan.json", "rank-00000.ledger.json")


def small_llama(folder: Path, seed: int) -> Path:
    """A float16 llama layer small enough (~220 KB) for many pulls per test."""
    arrays = llama_arrays(hidden=128, kv=32, inter=256, vocab=64, seed=seed)
    del arrays["model.layers.0.mlp.gate_proj.g_idx"]
    folder.mkdir()
    save_file(arrays, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def store(tmp_path: Path, home: Path) -> str:
    url = str(tmp_path / "store")
    ok(url, "keygen")
    ok(url, "push", small_llama(tmp_path / "v1", seed=1), REF)
    ok(url, "push", small_llama(tmp_path / "v2", seed=2), "m/s:2")
    return url


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry of ``folder`` (not following links): file bytes, link targets, folders."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink():
            out[path.name] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[path.name] = "dir"
        else:
            out[path.name] = path.read_bytes()
    return out


def parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".part-" in p.name)


def test_planted_link_is_refused_and_its_target_untouched(store: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    dest = tmp_path / "dest"
    dest.mkdir()
    for name in RANK0:
        (dest / name).symlink_to(victim)
        before = snapshot(dest)
        code, out = cli(store, "pull", REF, dest, "--tp", "2", "--rank", "0")
        assert code == 2 and out["error"]["type"] == "UsageError", out
        assert f"{dest / name}: is a symbolic link" in out["error"]["message"], out
        assert victim.read_text() == "precious"
        assert snapshot(dest) == before  # nothing published, no temporary file left
        (dest / name).unlink()
    # a hard link to someone's file at a final name: the rename replaces the name, not the file
    os.link(victim, dest / "rank-00000.ledger.json")
    res = ok(store, "pull", REF, dest, "--tp", "2", "--rank", "0")
    assert victim.read_text() == "precious"
    assert json.loads((dest / "rank-00000.ledger.json").read_text())["bytes_fetched"] == res["bytes_fetched"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(RANK0)


def test_failed_node_pull_leaves_dest_as_it_was(store: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    ok(store, "pull", REF, dest, "--tp", "2", "--ranks", "all")
    (dest / "rank-00001.plan.json").unlink()
    (dest / "rank-00001.plan.json").mkdir()  # the last rank's plan cannot be put in place
    (dest / "notes.txt").write_text("mine")
    before = snapshot(dest)
    code, out = cli(store, "pull", "m/s:2", dest, "--tp", "2", "--ranks", "all")
    assert code == 2 and "rank-00001.plan.json: exists and is not a regular file" in out["error"]["message"]
    assert snapshot(dest) == before  # rank 0's new files were not published either
    code, out = cli(store, "pull", "m/s:2", tmp_path / "new", "--tp", "2", "--rank", "0", "--force")
    assert code == 2 and "never deletes anything" in out["error"]["message"], out
    assert not (tmp_path / "new").exists()
    code, out = cli(store, "pull", REF, tmp_path / "store" / "ranks", "--tp", "2", "--rank", "0")
    assert code == 2 and "is inside the store" in out["error"]["message"], out
    assert not (tmp_path / "store" / "ranks").exists()


def _killed_rank_pull(store: str, dest: Path) -> None:
    killed = subprocess.run(
        [REGISTRY, "--store", store, "--json", "pull", REF, str(dest), "--tp", "2", "--ranks", "all"],
        env={**os.environ, "SHARDPORT_FAILPOINT": "rank-files-staged"},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def test_stale_parts_of_a_killed_rank_pull_are_removed_live_ones_kept(store: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    _killed_rank_pull(store, dest)
    stale = parts(dest)
    assert len(stale) == 5 and not any(n.startswith("rank-") for n in os.listdir(dest))
    live = re.sub(r"-[0-9]+-([0-9a-f]{12})$", rf"-{os.getpid()}-\1", temp_name("x.json", "part"))
    (dest / live).write_text("a pull still running in a live process")
    ok(store, "pull", REF, dest, "--tp", "2", "--rank", "1")
    assert parts(dest) == [live]
    assert sorted(os.listdir(dest)) == sorted(
        [live, "rank-00001-of-00002.safetensors", "rank-00001.plan.json", "rank-00001.ledger.json"]
    )


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def test_sigterm_while_staged_removes_every_temporary_file(store: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    proc = subprocess.Popen(
        [REGISTRY, "--store", store, "--json", "pull", REF, str(dest), "--tp", "2", "--ranks", "all"],
        env={**os.environ, "SHARDPORT_FAILPOINT": "rank-files-staged:pause"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,  # a test run in the background may have signals ignored
    )
    try:
        deadline = time.monotonic() + 60
        while len(parts(dest)) < 5:  # both ranks' files and the node ledger staged
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGTERM
    assert snapshot(dest) == {"notes.txt": b"mine"}


def test_rank_files_read_back(store: str, tmp_path: Path) -> None:
    """The staged writer's files are what the ranks hold (same tensors as one by one)."""
    node = ok(store, "pull", REF, tmp_path / "n", "--tp", "2", "--ranks", "all")
    from safetensors import safe_open

    for rank in node["ranks"]:
        with safe_open(rank["out"], "numpy") as f:
            meta = f.metadata()
            assert meta["shardport.rank"] == str(rank["rank"])
            assert sum(np.asarray(f.get_tensor(k)).nbytes for k in f.keys()) == rank["bytes_assigned"]
