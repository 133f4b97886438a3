"""S3 range reads through a fault-injecting proxy: transient failures are retried, lies are not."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest
from faultproxy import FaultProxy, blob_get
from loader_artifacts import Artifact, load, publish, rank_slices, write_safetensors
from servers import S3Server

from shardport.loader import RangeReadError
from shardport.registry.store.protocol import Store
from shardport.registry.store.retry import RetryPolicy, retryable
from shardport.registry.tiles.errors import TileDigestMismatchError

pytestmark = pytest.mark.s3


def _published(tmp_path: Path, url: str) -> Artifact:
    path = write_safetensors(tmp_path / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    return publish(path, url, target=8 << 10, minimum=512)


def _through(art: Artifact, proxy: FaultProxy, retry: RetryPolicy | None = None) -> Artifact:
    return dataclasses.replace(art, store=Store(art.store.url, s3_endpoint=proxy.endpoint, retry=retry))


def test_resets_truncations_and_500s_are_retried_and_every_byte_verified(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path
) -> None:
    art = _published(tmp_path, moto_store_url)
    with FaultProxy(moto_server.endpoint, rate=0.3, seed=7) as proxy:
        # 12 attempts: at a 30 % fault rate, 8 in a row on one of the hundreds of ranges happened (0.3^8
        # per range: a few % of runs); 0.3^12 makes a run that fails for want of attempts ~1e-4
        proxied = _through(art, proxy, RetryPolicy(attempts=12, base_delay=0.005, max_delay=0.05))
        retries = 0
        for rank, axis in ((0, "row"), (1, "col")):
            slices = rank_slices(art, 2, rank, axis)
            # requests unpriced: the column split is a request per row, enough requests for every fault
            result = load(proxied, slices, batch_bytes=64 << 10, depth=2, request_bytes=0)
            for s, got in zip(slices, result.arrays, strict=True):
                assert np.array_equal(got, art.expected(s))
            retries += result.ledger.retries
            assert result.ledger.to_json()["retries"] == result.ledger.retries
    assert {"reset", "truncate", "error"} <= set(proxy.counts), proxy.counts
    # each fault cost one re-request of its range, except that aiohttp itself re-sends a GET once when
    # the connection drops before any answer (so some resets never reach the retry layer)
    assert proxy.faults - proxy.counts["reset"] <= retries <= proxy.faults
    assert retries > 0


def test_a_storage_failing_every_read_ends_in_a_typed_error_after_the_bounded_attempts(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path
) -> None:
    art = _published(tmp_path, moto_store_url)
    slices = rank_slices(art, 2, 0, "row")
    for mode in ("reset", "truncate", "error"):
        with FaultProxy(moto_server.endpoint, rate=1.0, modes=(mode,), match=blob_get) as proxy:
            proxied = _through(art, proxy, RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02))
            start = time.monotonic()
            with pytest.raises(RangeReadError, match="failed 3 attempts") as info:
                load(proxied, slices, batch_bytes=16 << 10, depth=1)
            assert time.monotonic() - start < 20
            assert retryable(info.value.__cause__ or info.value)
            # aiohttp itself re-sends a GET once when reset before any answer (RFC 9112 9.3.1)
            assert proxy.seen and set(proxy.seen.values()) == {6 if mode == "reset" else 3}, (
                mode,
                proxy.seen,
            )


def test_a_complete_body_with_a_wrong_byte_is_refused_not_retried(
    moto_server: S3Server, moto_store_url: str, tmp_path: Path
) -> None:
    art = _published(tmp_path, moto_store_url)
    slices = rank_slices(art, 2, 1, "row")
    with FaultProxy(moto_server.endpoint, rate=1.0, modes=("flip",), match=blob_get) as proxy:
        with pytest.raises(TileDigestMismatchError):
            load(_through(art, proxy), slices, batch_bytes=64 << 10, depth=1, verify_workers=0)
        assert proxy.counts["flip"] >= 1
        assert set(proxy.seen.values()) == {1}  # no range was asked for twice
