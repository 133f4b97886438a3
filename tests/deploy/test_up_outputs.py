"""``registry up --logits-out/--report`` write atomically: a temporary file in the same folder (created
``O_EXCL | O_NOFOLLOW``, read back, flushed, renamed over a regular file), removed on any failure; a
link, pipe or anything but a regular file at the name is refused, never followed or opened."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from shardport.deploy.report import write_report
from shardport.deploy.up import write_logits
from shardport.registry.errors import UsageError


def test_writes_replace_a_regular_file_atomically_and_leave_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "logits.safetensors"
    out.write_bytes(b"old")
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_logits(out, logits)
    assert np.array_equal(load_file(str(out))["logits"], logits)
    page = tmp_path / "report.html"
    write_report({"digest": "sha256:" + "0" * 64, "passed": True}, page)
    assert page.read_text().startswith("<!")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.safetensors", "report.html"]


def test_a_link_or_pipe_appearing_before_the_write_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    (tmp_path / "report.html").symlink_to(target)
    with pytest.raises(UsageError, match="is a symbolic link; refusing to write through it"):
        write_report({"digest": "sha256:" + "0" * 64}, tmp_path / "report.html")
    os.mkfifo(tmp_path / "logits")  # an open() of it would block: never opened
    with pytest.raises(UsageError, match="not a regular file"):
        write_logits(tmp_path / "logits", np.zeros((1, 2), np.float32))
    assert target.read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits", "report.html", "target"]  # no temp
