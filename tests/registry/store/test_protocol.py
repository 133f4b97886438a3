"""The store protocol's own calls, one suite for every backend: ranged reads, many reads, local files
and the read profile each backend reports (what the loader plans by instead of asking which it is)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.errors import NotFoundError, StoreError, StoreObjectError, UsageError
from shardport.registry.store.keys import blob_key
from shardport.registry.store.local import LocalStore
from shardport.registry.store.protocol import ReadProfile, Store, open_store


def test_ranged_reads_in_order_missing_objects_as_file_not_found(store_url: str) -> None:
    store = open_store(store_url)
    data = bytes(range(256)) * 40
    digest = store.put_blob(data)
    key = blob_key(digest)
    missing = blob_key(digest_bytes(b"nothing"))
    results, retries = store.read_ranges(
        [(key, 5000, 5100), (key, 0, 3), (missing, 0, 10), (key, 10_200, 10_300)], concurrency=2
    )
    assert results[:2] == [data[5000:5100], data[:3]]
    assert isinstance(results[2], FileNotFoundError)
    assert results[3] == data[10_200:]  # fewer bytes only where the object ends
    assert retries == 0


def test_read_many_keeps_the_order_and_the_first_error(store_url: str) -> None:
    store = open_store(store_url)
    for n in range(5):
        store.put(f"docs/{n}.json", str(n).encode() * (n + 1))
    assert store.read_many([f"docs/{n}.json" for n in (3, 0, 4)]) == [b"3333", b"0", b"44444"]
    assert store.read_many([]) == []
    with pytest.raises(NotFoundError, match=r"docs/9\.json"):
        store.read_many(["docs/1.json", "docs/9.json"])


def test_profile_local_root_and_local_files_agree(store_url: str) -> None:
    store = open_store(store_url)
    profile = store.profile
    assert isinstance(profile, ReadProfile)
    assert profile.file_handles == profile.direct_io == (store.local_root is not None)
    digest = store.put_blob(b"a blob")
    if store.local_root is None:
        assert profile.max_gap == 1 << 20 and profile.depth == 4
        assert profile.request_bytes == 1 << 20 and profile.max_amplification == 8.0  # requests priced
        with pytest.raises(StoreError, match="no local files"):
            store.open_local(blob_key(digest))
        return
    assert profile.max_gap == 4096 and 4 <= profile.depth <= 8
    assert profile.request_bytes == 0  # a run is a preadv iovec: plans keep to the gap budget
    assert store.local_root == Path(store_url).resolve()
    fd = store.open_local(blob_key(digest))
    try:
        assert os.pread(fd, 100, 0) == b"a blob"
    finally:
        os.close(fd)


def test_store_url_opens_its_backend(tmp_path: Path) -> None:
    local = Store(str(tmp_path / "s"))
    assert isinstance(local, LocalStore) and type(open_store(f"file://{tmp_path}/s")) is LocalStore
    assert local.local_root == tmp_path / "s"
    with pytest.raises(UsageError, match="gs://"):
        open_store("gs://bucket/x")


def test_local_ranged_reads_refuse_a_link_in_a_blobs_place(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    digest = store.put_blob(b"x" * 100)
    blob = tmp_path / "store" / blob_key(digest)
    blob.unlink()
    blob.symlink_to("/dev/zero")
    [found], _ = store.read_ranges([(blob_key(digest), 0, 10)], concurrency=1)
    assert isinstance(found, StoreObjectError) and "symbolic link" in str(found)
