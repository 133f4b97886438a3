"""Store reads on S3 through a fault-injecting proxy: bounded, retried, lies refused (fast, no CLI)."""

from __future__ import annotations

import time

import pytest
from faultproxy import FaultProxy
from servers import S3Server

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.errors import DigestMismatchError, NotFoundError, StoreError, StoreObjectError
from shardport.registry.store.keys import blob_key
from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy

pytestmark = pytest.mark.s3
FAST = RetryPolicy(attempts=4, base_delay=0.005, max_delay=0.02)


def test_documents_and_blob_streams_retry_then_give_up_with_a_typed_error(
    moto_server: S3Server, moto_store_url: str
) -> None:
    direct = Store(moto_store_url)
    data = bytes(range(256)) * 400
    digest = direct.put_blob(data)
    direct.put("repos/a/doc.json", b'{"x": 1}')
    with FaultProxy(moto_server.endpoint, rate=0.5, seed=3, per_request=3) as proxy:
        store = Store(moto_store_url, s3_endpoint=proxy.endpoint, retry=FAST)
        for _ in range(3):
            assert store.read("repos/a/doc.json") == b'{"x": 1}'
            assert store.digest_blob(digest, max_size=len(data)) == (digest, len(data))
            assert store.read_blob(digest) == data
        assert proxy.faults > 0
        with pytest.raises(NotFoundError):
            store.read("repos/a/missing.json")
        with pytest.raises(NotFoundError):
            store.digest_blob(digest_bytes(b"absent"))
    for mode in ("reset", "truncate", "error"):
        with FaultProxy(moto_server.endpoint, rate=1.0, modes=(mode,)) as proxy:
            store = Store(moto_store_url, s3_endpoint=proxy.endpoint, retry=FAST)
            start = time.monotonic()
            with pytest.raises(StoreError, match="failed 4 attempts"):
                store.read("repos/a/doc.json")
            with pytest.raises(StoreError, match="failed 4 attempts"):
                store.digest_blob(digest)
            assert time.monotonic() - start < 10
            per_attempt = 2 if mode == "reset" else 1  # aiohttp re-sends a GET reset before any answer
            assert set(proxy.seen.values()) == {4 * per_attempt}, (mode, proxy.seen)


def test_wrong_bytes_in_a_complete_body_are_final_and_bodies_are_bounded(
    moto_server: S3Server, moto_store_url: str
) -> None:
    direct = Store(moto_store_url)
    data = b"z" * 5000
    digest = direct.put_blob(data)
    with FaultProxy(moto_server.endpoint, rate=1.0, modes=("flip",)) as proxy:
        store = Store(moto_store_url, s3_endpoint=proxy.endpoint, retry=FAST)
        with pytest.raises(DigestMismatchError):
            store.read_blob(digest)
        assert list(proxy.seen.values()) == [1]
    store = Store(moto_store_url, retry=FAST)
    with pytest.raises(StoreObjectError, match="more bytes"):
        store.read(blob_key(digest), max_size=4999)
    got, size = store.digest_blob(digest, max_size=100)  # reads 101 bytes: "more than 100"
    assert size == 101 and got != digest
    [part], retries = store.read_ranges([(blob_key(digest), 4990, 5010)], concurrency=1)
    assert part == data[4990:] and retries == 0  # where the object ends: short, not retried
