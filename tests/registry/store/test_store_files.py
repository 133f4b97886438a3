"""The store's own files are not trusted: a link, a pipe, a device or a folder where a file belongs.

Someone with write access to a shared store folder replaces a blob (or a manifest, a tag document, a
folder of the layout) with a symbolic link to ``/dev/zero`` or to a huge sparse file, a named pipe or a
folder. pull, verify and fsck must refuse it promptly with a typed error naming the object and what was
found, write nothing big, and never hang (each test has a timeout, so a regression fails instead).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import Cli, make_checkpoint

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.errors import StoreObjectError
from shardport.registry.session import Session
from shardport.registry.store.keys import DOCUMENT_MAX, blob_key, tag_key
from shardport.registry.store.localfiles import open_store_file
from shardport.registry.store.protocol import Store

REF = "acme/files:v1"
SPARSE = 64 << 30  # a 64 GiB sparse file: nothing may copy or hash it


def _link_zero(path: Path, tmp: Path) -> str:
    path.unlink()
    path.symlink_to("/dev/zero")
    return "a symbolic link"


def _link_sparse(path: Path, tmp: Path) -> str:
    big = tmp / "sparse.bin"
    with open(big, "wb") as fh:
        fh.truncate(SPARSE)
    path.unlink()
    path.symlink_to(big)
    return "a symbolic link"


def _fifo(path: Path, tmp: Path) -> str:
    path.unlink()
    os.mkfifo(path)
    return "a named pipe"


def _folder(path: Path, tmp: Path) -> str:
    path.unlink()
    path.mkdir()
    (path / "x").write_bytes(b"x")
    return "a folder"


REPLACEMENTS: dict[str, Callable[[Path, Path], str]] = {
    "link-to-dev-zero": _link_zero,
    "link-to-sparse-file": _link_sparse,
    "named-pipe": _fifo,
    "folder": _folder,
}


def _written(root: Path) -> int:
    """Bytes of the regular files under ``root`` (links not followed), the sparse file left out."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath, name)
            if p.is_file() and not p.is_symlink() and p.name != "sparse.bin":
                total += p.stat().st_size
    return total


@pytest.fixture
def pushed(tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Cli, Session, Manifest]:
    store = str(tmp_path / "store")
    cli = Cli(capsys, store)
    cli.ok("keygen")
    digest = cli.ok("push", make_checkpoint(tmp_path / "ck", files=1), REF)["digest"]
    session = Session.open(store)
    return cli, session, Manifest.from_bytes(session.store.read_blob(digest))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(REPLACEMENTS))
def test_pull_verify_fsck_refuse_a_blob_that_is_not_a_regular_file(
    kind: str, pushed: tuple[Cli, Session, Manifest], tmp_path: Path
) -> None:
    cli, session, manifest = pushed
    shard = next(f for f in manifest.files if f.path.endswith(".bin"))
    key = blob_key(shard.digest)
    found = REPLACEMENTS[kind](Path(session.store.path(key)), tmp_path)
    before = _written(tmp_path)
    start = time.monotonic()
    code, out = cli("pull", REF, tmp_path / "out")
    assert code == 1 and out["error"]["type"] == "StoreObjectError", out
    assert key in out["error"]["message"] and found in out["error"]["message"], out
    assert not (tmp_path / "out").exists()
    code, out = cli("verify", REF)
    assert code == 1 and not out["ok"]
    [finding] = out["findings"]
    assert finding["kind"] == "StoreObjectError" and finding["object"] == shard.path, finding
    assert found in finding["message"]
    code, out = cli("fsck")
    assert code != 0 and not out["ok"]
    problems = out["corrupt"] + out["dangling"]
    assert any(shard.digest in p for p in problems), out
    if kind != "folder":  # a folder holds no blob: fsck finds the blob missing instead
        assert any(found in p for p in out["corrupt"]), out
    assert time.monotonic() - start < 20  # prompt: nothing read the 64 GiB, nothing waited on the pipe
    assert _written(tmp_path) - before < 1 << 20  # and nothing big was written


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["manifest", "tag-document"])
def test_a_named_pipe_in_place_of_a_manifest_or_tag_document_is_refused(
    kind: str, pushed: tuple[Cli, Session, Manifest], tmp_path: Path
) -> None:
    cli, session, _ = pushed
    key = blob_key(_head(session)) if kind == "manifest" else tag_key("acme/files", "v1", 1)
    _fifo(Path(session.store.path(key)), tmp_path)
    code, out = cli("pull", REF, tmp_path / "out")
    assert code == 1 and out["error"]["type"] == "StoreObjectError", out
    assert key in out["error"]["message"] and "named pipe" in out["error"]["message"]


def _head(session: Session) -> str:
    from shardport.registry.trust.tagging import history

    return history(session, "acme/files", "v1")[-1].doc.target


def test_a_linked_folder_inside_the_store_is_refused(
    pushed: tuple[Cli, Session, Manifest], tmp_path: Path
) -> None:
    cli, session, _ = pushed
    blobs = Path(session.store.path("blobs/sha256"))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(blobs, elsewhere)
    shutil.rmtree(blobs)
    blobs.symlink_to(elsewhere)
    code, out = cli("pull", REF, tmp_path / "out")
    assert code == 1 and out["error"]["type"] == "StoreObjectError", out
    assert "folder 'blobs/sha256'" in out["error"]["message"] and "symbolic link" in out["error"]["message"]


def test_reads_are_bounded(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    store.put("repos/x/doc.json", b"{}")
    big = Path(store.path("repos/x/big.json"))
    with open(big, "wb") as fh:
        fh.truncate(DOCUMENT_MAX + 1)
    assert store.read("repos/x/doc.json") == b"{}"
    with pytest.raises(StoreObjectError, match="more than the documented maximum"):
        store.read("repos/x/big.json")
    digest = store.put_blob(b"a" * 1000)
    with pytest.raises(StoreObjectError, match="more than"):
        store.read_blob(digest, max_size=999)
    assert store.digest_blob(digest) == (digest, 1000)
    got, size = store.digest_blob(digest, max_size=10)  # reads 11 bytes: "more than 10"
    assert size == 11 and got != digest
    assert store.fetch_blob(digest, tmp_path / "copy", max_size=999) == ("(a blob of 1000 bytes)", 1000)
    assert not (tmp_path / "copy").exists()
    for bad in ("../x", "blobs//x", "./blobs"):
        with pytest.raises(StoreObjectError, match="not a store key"):
            open_store_file(store.root, bad)


def test_a_push_replaces_a_link_planted_in_a_blobs_place(
    pushed: tuple[Cli, Session, Manifest], tmp_path: Path
) -> None:
    cli, session, manifest = pushed
    shard = next(f for f in manifest.files if f.path.endswith(".bin"))
    _link_zero(Path(session.store.path(blob_key(shard.digest))), tmp_path)
    assert not session.store.has_blob(shard.digest)
    cli.ok("push", tmp_path / "ck", "acme/files:v2")  # the same files: the blob is uploaded again
    assert session.store.has_blob(shard.digest)
    assert cli.ok("pull", REF, tmp_path / "out")["digest"] == _head(session)
