"""One contract suite for every store backend (local folder, moto, SeaweedFS)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, UsageError
from shardport.registry.hashing import digest_bytes, digest_file
from shardport.registry.store import AlreadyExists, Store, blob_key, file_identity


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


def test_bad_url() -> None:
    with pytest.raises(UsageError, match="s3://"):
        Store("gs://bucket/x")
