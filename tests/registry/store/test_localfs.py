"""LocalFiles answers the local store's filesystem calls exactly as fsspec's LocalFileSystem does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from shardport.registry.store.localfs import LocalFiles


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Files, folders, links to both, a dangling link and a named pipe."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"hello")
    (tmp_path / "a" / "g").write_bytes(b"xy")
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "a" / "b", tmp_path / "a" / "link-to-folder")
    os.symlink(tmp_path / "a" / "g", tmp_path / "a" / "link-to-file")
    os.symlink(tmp_path / "missing", tmp_path / "a" / "dangling")
    os.mkfifo(tmp_path / "a" / "fifo")
    return tmp_path


def _outcome(call: Any) -> Any:
    try:
        return call()
    except OSError as exc:
        return type(exc).__name__


def _brief(info: dict[str, Any]) -> tuple[Any, ...]:
    return (info["name"], info["size"], info["type"], info["islink"], int(info["mtime"]))


@pytest.mark.parametrize("rel", ["a", "a/b", "empty", "a/g", "a/link-to-file", "a/link-to-folder", "nothing"])
def test_same_answers_as_fsspec(tree: Path, rel: str) -> None:
    path = str(tree / rel)
    ours, theirs = LocalFiles(), LocalFileSystem()
    assert ours.exists(path) == theirs.exists(path)
    assert _outcome(lambda: _brief(ours.info(path))) == _outcome(lambda: _brief(theirs.info(path)))
    assert _outcome(lambda: sorted(ours.ls(path))) == _outcome(lambda: sorted(theirs.ls(path)))
    found = _outcome(lambda: {k: _brief(v) for k, v in ours.find(path, detail=True).items()})
    expected = _outcome(lambda: {k: _brief(v) for k, v in theirs.find(path, detail=True).items()})
    assert found == expected
    assert _outcome(lambda: ours.find(path)) == _outcome(lambda: theirs.find(path))


def test_reads_writes_and_removals(tree: Path) -> None:
    ours = LocalFiles()
    f = str(tree / "a" / "b" / "f")
    assert ours.cat_file(f) == b"hello" and ours.cat_file(f, start=1, end=3) == b"el"
    assert ours.cat_file(f, start=3) == b"lo"
    ours.pipe_file(f, b"new")
    assert Path(f).read_bytes() == b"new"
    with pytest.raises(FileExistsError):
        ours.pipe_file(f, b"again", mode="create")
    with ours.open(str(tree / "a" / "h"), "wb", block_size=1 << 20) as fh:
        fh.write(b"opened")
    assert (tree / "a" / "h").read_bytes() == b"opened"
    ours.rm_file(str(tree / "a" / "g"))
    assert not (tree / "a" / "g").exists()
    with pytest.raises(FileNotFoundError):
        ours.rm_file(str(tree / "a" / "g"))
    ours.rm(str(tree / "a"), recursive=True)
    assert not (tree / "a").exists()
    with pytest.raises(FileNotFoundError):
        ours.rm(str(tree / "a"), recursive=True)
