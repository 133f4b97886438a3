"""Workers beyond the fetch depth: at most ``depth`` batches are fetched at once while the others verify."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loader_artifacts import Artifact, load, publish, rank_slices, write_safetensors

from shardport.loader.ranges import FetchPlan
from shardport.loader.read import _Runner
from shardport.loader.schedule import Band, schedule_reads
from shardport.loader.sources import BlobSource, Dest, TileCheck, open_source
from shardport.registry.tiles import TileDigestMismatchError


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    root = tmp_path_factory.mktemp("workers")
    return publish(write_safetensors(root / "ckpt"), str(root / "store"), minimum=2 << 10)


class _Counting:
    """A real source whose ``fetch`` counts how many run at once (each held a few ms so they overlap)."""

    def __init__(self, inner: BlobSource) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.now = self.peak = self.calls = 0

    def fetch(
        self, plan: FetchPlan, bands: Sequence[Band], dests: Sequence[Dest], check: TileCheck | None = None
    ) -> None:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(0.005)
            self.inner.fetch(plan, bands, dests, check)
        finally:
            with self.lock:
                self.now -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize(("depth", "spare"), [(2, 3), (3, 0), (1, 2)])
def test_at_most_depth_batches_are_fetched_at_once(art: Artifact, depth: int, spare: int) -> None:
    slices = [s for rank in range(4) for s in rank_slices(art, 4, rank, "col")]
    schedule = schedule_reads(slices, art.entries, art.files, art.index, batch_bytes=4 << 10, max_gap=4096)
    assert len(schedule.batches) > 4 * (depth + spare)
    source = _Counting(open_source(art.store, schedule.blobs))
    outputs = [np.empty(s.shape, np.uint8) for s in schedule.slices]
    runner = _Runner(schedule, art.index, outputs, source, depth, verify_workers=spare, page_cache=False)
    try:
        runner.run()
    finally:
        source.inner.close()
    assert runner.threads == depth + spare
    assert source.calls == len(schedule.batches)
    assert source.peak == depth  # reached (fetches held 5 ms overlap), never passed
    for s, got in zip(slices, outputs, strict=True):
        assert np.array_equal(got, art.expected(s))


@pytest.mark.parametrize("spare", [0, 1, 3])
def test_spare_workers_change_neither_the_bytes_nor_the_accounting(art: Artifact, spare: int) -> None:
    slices = [s for rank in range(2) for s in rank_slices(art, 2, rank, "row")]
    result = load(art, slices, batch_bytes=16 << 10, depth=2, verify_workers=spare, page_cache=False)
    for s, got in zip(slices, result.arrays, strict=True):
        assert np.array_equal(got, art.expected(s))
    ledger = result.ledger
    reference = load(art, slices, batch_bytes=16 << 10, depth=2, verify_workers=0, page_cache=False).ledger
    assert ledger.bytes_fetched == reference.bytes_fetched and ledger.requests == reference.requests
    # the staging bound counts every worker: depth + spare (the schedule has enough batches for all)
    assert ledger.staging_bound_bytes == reference.staging_bound_bytes * (2 + spare) // 2
    assert ledger.peak_staging_bytes <= ledger.staging_bound_bytes


def test_a_mismatch_found_by_a_verifying_worker_stops_the_load(tmp_path: Path) -> None:
    art = publish(write_safetensors(tmp_path / "ckpt"), str(tmp_path / "store"), minimum=2 << 10)
    slices = rank_slices(art, 2, 1, "row")
    s = slices[-1]
    t = art.index.tensors[s.tensor]
    art.flip(t.start + (s.row0 + 1) * t.row_bytes + 3)
    with pytest.raises(TileDigestMismatchError, match=s.tensor):
        load(art, slices, batch_bytes=8 << 10, depth=1, verify_workers=3, page_cache=False)
