"""One output file (``registry up --logits-out/--report``): pull's destination rules for one file.

Regular files only (no link followed, no device, pipe, socket or folder replaced), never inside the
store or ``SHARDPORT_HOME``, in an existing folder (the atomic writes: tests/deploy/test_up_outputs.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from shardport.registry.errors import UsageError
from shardport.registry.output.destination import file_destination

FLAG = "--logits-out"


def _check(path: Path, store: Path | None = None) -> Path:
    return file_destination(path, store_root=store, flag=FLAG)


def test_a_new_file_or_a_regular_file_is_accepted(tmp_path: Path) -> None:
    assert _check(tmp_path / "new.safetensors") == tmp_path / "new.safetensors"
    (tmp_path / "old").write_bytes(b"old")
    assert _check(tmp_path / "old") == tmp_path / "old"
    (tmp_path / "sub").mkdir()
    assert _check(tmp_path / "sub" / ".." / "x") == tmp_path / "x"  # the folder resolved, the name kept


@pytest.mark.parametrize(
    ("path", "what"),
    [("/dev/null", "a character device"), ("/dev/full", "a character device")],
)
def test_devices_are_refused(path: str, what: str) -> None:
    with pytest.raises(UsageError, match=rf"{FLAG} {path}: exists and is {what}; {FLAG} replaces only"):
        _check(Path(path))


def test_links_pipes_sockets_and_folders_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    try:
        for name, what in [
            ("link", "a symbolic link"),
            ("fifo", "a named pipe"),
            ("sock", "a socket"),
            ("dir", "a folder"),
        ]:
            with pytest.raises(UsageError, match=f"exists and is {what}"):
                _check(tmp_path / name)
    finally:
        sock.close()
    with pytest.raises(UsageError, match="is a folder"):
        _check(Path("."))
    assert target.read_bytes() == b"keep"


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"its folder .*/absent does not exist"):
        _check(tmp_path / "absent" / "logits.safetensors")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UsageError, match=r"/file is not a folder"):
        _check(tmp_path / "file" / "logits.safetensors")


def test_the_store_and_shardports_home_are_refused(tmp_path: Path, home: Path) -> None:
    store = tmp_path / "store"
    (store / "blobs").mkdir(parents=True)
    home.mkdir()
    with pytest.raises(UsageError, match=rf"is inside the store \({store}\); {FLAG} never writes there"):
        _check(store / "blobs" / "x", store)
    (tmp_path / "via").symlink_to(store)  # a link to the store as the folder: resolved, still refused
    with pytest.raises(UsageError, match="is inside the store"):
        _check(tmp_path / "via" / "x", store)
    with pytest.raises(UsageError, match="is inside shardport's home folder"):
        _check(home / "report.html")


def test_a_link_loop_on_the_way_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(UsageError, match=r"cannot resolve the path"):
        _check(tmp_path / "loop" / "logits.safetensors")
