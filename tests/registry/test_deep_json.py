"""A config file nested deeper than Python parses is read as unreadable, never an internal error (exit 70)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import Cli, make_checkpoint


def test_a_deeply_nested_config_is_not_an_internal_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path
) -> None:
    cli = Cli(capsys, str(tmp_path / "store"))
    cli.ok("keygen")
    folder = make_checkpoint(tmp_path / "ckpt")
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    code, out = cli("push", folder, "deep/config:v1")
    assert code != 70, out
    assert code == 0 or out["error"]["type"] != "InternalError", out
