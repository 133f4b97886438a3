"""One contract suite for every store backend (local folder, moto, SeaweedFS)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from shardport.registry.artifact.hashing import digest_bytes, digest_file
from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, UsageError
from shardport.registry.store.copies import file_identity
from shardport.registry.store.keys import blob_key
from shardport.registry.store.protocol import AlreadyExists, Store


@pytest.fixture
def store(store_url: str) -> Store:
    return Store(store_url)


def test_put_read_list_walk_delete(store: Store) -> None:
    store.put("a/b/c.json", b"1")
    store.put("a/b/d.json", b"22")
    store.put("a/e", b"333")
    assert store.read("a/b/c.json") == b"1"
    assert store.listdir("a") == ["b", "e"]
    assert store.listdir("a/b") == ["c.json", "d.json"]
    assert store.listdir("nothing/here") == []
    assert [(o.key, o.size) for o in store.walk("a")] == [("a/b/c.json", 1), ("a/b/d.json", 2), ("a/e", 3)]
    store.put("a/e", b"replaced")
    assert store.read("a/e") == b"replaced"
    store.delete("a/e")
    store.delete("a/e")  # idempotent
    assert not store.exists("a/e")
    with pytest.raises(NotFoundError, match="a/e"):
        store.read("a/e")
    store.delete_tree("a")
    assert store.walk("a") == []


def test_create_only_exactly_one_winner(store: Store) -> None:
    wins: list[int] = []
    losses: list[int] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        barrier.wait()
        try:
            store.create_only("race/x.json", f"writer {i}".encode())
            wins.append(i)
        except AlreadyExists:
            losses.append(i)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert store.read("race/x.json") == f"writer {wins[0]}".encode()


def test_blobs(store: Store, tmp_path: Path) -> None:
    d = store.put_blob(b"hello")
    assert d == digest_bytes(b"hello") and store.has_blob(d)
    assert store.read_blob(d) == b"hello"
    store.put(blob_key(d), b"hellO")
    with pytest.raises(DigestMismatchError, match=d):
        store.read_blob(d)

    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    digest, size = digest_file(src)
    assert store.upload_blob(src, digest) == size
    got, n = store.fetch_blob(digest, tmp_path / "back.bin")
    assert (got, n) == (digest, size)
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    got, n = store.fetch_blob(digest, tmp_path / "small.bin", max_size=1000)
    assert n > 1000 and got != digest
    with pytest.raises(StoreError, match="exists"):
        store.fetch_blob(digest, tmp_path / "back.bin")


def test_upload_refuses_changed_source(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    wrong = digest_bytes(b"something else")
    ident = file_identity(src)
    with pytest.raises(DigestMismatchError, match="changed while pushing"):
        store.upload_blob(src, wrong)  # no identity: the stored bytes are hashed
    right, _ = digest_file(src)
    src.write_bytes(b"y" * 1001)  # changed after hashing: size and mtime move
    with pytest.raises(DigestMismatchError, match="changed while pushing"):
        store.upload_blob(src, right, identity=ident)
    assert not store.has_blob(wrong) and not store.has_blob(right)


def test_a_local_store_moves_a_work_file_into_place_without_copying(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    src = tmp_path / "out.bin"  # on the store's file system
    src.write_bytes(os.urandom(1 << 20))
    ident = file_identity(src)
    digest, size = digest_file(src)
    assert store.upload_blob(src, digest, identity=ident, move=True) == size
    assert not src.exists()  # renamed, not copied
    assert os.stat(store.path(blob_key(digest))).st_ino == ident[0]
    assert digest_file(Path(store.path(blob_key(digest))))[0] == digest


def test_a_moved_work_file_changed_after_hashing_is_refused(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    src = tmp_path / "out.bin"
    src.write_bytes(b"x" * 4096)
    ident = file_identity(src)
    digest, _ = digest_file(src)
    src.write_bytes(b"y" * 4097)
    with pytest.raises(DigestMismatchError, match="changed after it was hashed"):
        store.upload_blob(src, digest, identity=ident, move=True)
    assert not store.has_blob(digest) and src.exists()


def test_a_work_file_on_another_file_system_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(str(tmp_path / "store"))
    src = tmp_path / "elsewhere.bin"
    src.write_bytes(os.urandom(70_000))
    ident = file_identity(src)
    digest, size = digest_file(src)
    real = os.replace

    def across_devices(a: str | Path, b: str | Path) -> None:  # what rename(2) says across file systems
        if Path(a) == src:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(a, b)

    monkeypatch.setattr(os, "replace", across_devices)
    assert store.upload_blob(src, digest, identity=ident, move=True) == size
    assert src.exists() and store.read_blob(digest) == src.read_bytes()  # copied instead


def test_bad_url() -> None:
    with pytest.raises(UsageError, match="s3://"):
        Store("gs://bucket/x")
