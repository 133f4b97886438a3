"""Turns and spare workers: ``depth`` batches in flight; one whose fetch waited on the storage gives its
turn back before it is verified, so another batch fetches meanwhile (on one of ``verify_workers`` spare
workers). A fetch served from memory keeps its turn: warm loads run ``depth`` batches at once, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loader_artifacts import Artifact, load, publish, rank_slices, write_safetensors

from shardport.loader.ranges import FetchPlan
from shardport.loader.runner import _Runner
from shardport.loader.schedule import Band, schedule_reads
from shardport.loader.sources import BlobSource, Dest, TileCheck, open_source
from shardport.registry.tiles.errors import TileDigestMismatchError

HOLD = 0.004
"""Seconds each fetch and each verification is held, so that concurrent ones overlap for certain."""


class _Activity:
    """Counts the threads fetching, and fetching or verifying, at once (peaks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fetching = self.busy = self.peak_fetching = self.peak_busy = self.fetches = 0
        self.waited: list[bool] = []

    @contextmanager
    def active(self, fetch: bool) -> Iterator[None]:
        with self.lock:
            self.busy += 1
            self.fetching += fetch
            self.fetches += fetch
            self.peak_busy = max(self.peak_busy, self.busy)
            self.peak_fetching = max(self.peak_fetching, self.fetching)
        try:
            time.sleep(HOLD)
            yield
        finally:
            with self.lock:
                self.busy -= 1
                self.fetching -= fetch


class _CountingSource:
    """A real source whose fetches are counted (and what each answered: whether it waited)."""

    def __init__(self, inner: BlobSource, activity: _Activity) -> None:
        self.inner, self.activity = inner, activity

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> bool:
        with self.activity.active(fetch=True):
            waited = self.inner.fetch(plan, bands, dests, check)
        self.activity.waited.append(waited)
        return waited

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CountingRunner(_Runner):
    """The real runner, its verification counted."""

    activity: _Activity

    def _verify(self, *args: Any, **kwargs: Any) -> tuple[float, float, bool]:
        with self.activity.active(fetch=False):
            return super()._verify(*args, **kwargs)


def run_counted(art: Artifact, depth: int, spare: int) -> _Activity:
    slices = [s for rank in range(4) for s in rank_slices(art, 4, rank, "row")]
    schedule = schedule_reads(slices, art.entries, art.files, art.index, batch_bytes=8 << 10, max_gap=4096)
    assert len(schedule.batches) > 4 * (depth + spare)
    activity = _Activity()
    source = _CountingSource(open_source(art.store, schedule.blobs), activity)
    outputs = [np.empty(s.shape, np.uint8) for s in schedule.slices]
    runner = _CountingRunner(
        schedule, art.index, outputs, source, depth, verify_workers=spare, page_cache=False
    )
    runner.activity = activity
    try:
        runner.run()
    finally:
        source.inner.close()
    assert runner.threads == depth + spare
    assert activity.fetches == len(schedule.batches)
    for s, got in zip(slices, outputs, strict=True):
        assert np.array_equal(got, art.expected(s))
    return activity


@pytest.mark.parametrize(("depth", "spare"), [(2, 3), (1, 2)])
def test_cached_fetches_keep_their_turn_so_depth_batches_run_at_once(
    tmp_path: Path, depth: int, spare: int
) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    activity = run_counted(art, depth, spare)  # the blob was just written: in the page cache
    assert not any(activity.waited)
    assert activity.peak_fetching == activity.peak_busy == depth  # reached (held overlaps), not passed


@pytest.mark.s3
@pytest.mark.parametrize(("depth", "spare"), [(2, 2), (2, 0)])
def test_fetches_that_wait_on_the_storage_let_spare_workers_verify_meanwhile(
    moto_store_url: str, tmp_path: Path, depth: int, spare: int
) -> None:
    path = write_safetensors(tmp_path / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    art = publish(path, moto_store_url, target=8 << 10, minimum=512)
    activity = run_counted(art, depth, spare)
    assert all(activity.waited)  # every S3 fetch waits on the network
    assert activity.peak_fetching == depth
    assert activity.peak_busy == depth + spare  # spare workers verified while depth batches fetched


@pytest.mark.parametrize("spare", [0, 1, 3])
def test_spare_workers_change_neither_the_bytes_nor_the_accounting(tmp_path: Path, spare: int) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    slices = [s for rank in range(2) for s in rank_slices(art, 2, rank, "row")]
    result = load(art, slices, batch_bytes=16 << 10, depth=2, verify_workers=spare, page_cache=False)
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s))
    ledger = result.ledger
    reference = load(art, slices, batch_bytes=16 << 10, depth=2, verify_workers=0, page_cache=False).ledger
    assert ledger.bytes_fetched == reference.bytes_fetched and ledger.requests == reference.requests
    # the bounds count every worker: depth + spare (the schedule has enough batches for all)
    assert ledger.staging_bound_bytes == reference.staging_bound_bytes * (2 + spare) // 2
    assert ledger.peak_staging_bytes <= ledger.staging_bound_bytes


@pytest.mark.s3
def test_a_mismatch_found_while_spare_workers_run_stops_the_load(moto_store_url: str, tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "ckpt", hidden=128, kv=32, inter=256, vocab=64)
    art = publish(path, moto_store_url, target=8 << 10, minimum=512)
    slices = rank_slices(art, 2, 1, "row")
    s = slices[-1]
    t = art.index.tensors[s.tensor]
    art.flip(t.start + (s.row0 + 1) * t.row_bytes + 3)
    with pytest.raises(TileDigestMismatchError, match=s.tensor):
        load(art, slices, batch_bytes=1 << 10, depth=1, verify_workers=3)
