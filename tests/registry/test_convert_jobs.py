"""Convert's validation runs its checks on a pool with a bound on the bytes in flight."""

from __future__ import annotations

import math
import threading
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from llama_artifacts import gguf_llama, gptq_llama, ok

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.checkpoint.analysis import PlaneReader, stored_inventory
from shardport.registry.contracts import LogicalWeight
from shardport.registry.convert import _check_weight, _run_bounded, check_cost
from shardport.registry.errors import VerificationError
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key


class _Meter:
    """Records the cost in flight while jobs run (each job sleeps a little to overlap with others)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = self.peak = self.concurrent = self.peak_concurrent = 0
        self.ran: list[int] = []

    def job(self, k: int, cost: int, fail: bool = False) -> Callable[[], None]:
        def run() -> None:
            with self.lock:
                self.held += cost
                self.concurrent += 1
                self.peak = max(self.peak, self.held)
                self.peak_concurrent = max(self.peak_concurrent, self.concurrent)
            time.sleep(0.01)
            with self.lock:
                self.held -= cost
                self.concurrent -= 1
                self.ran.append(k)
            if fail:
                raise VerificationError(f"job {k} failed")

        return run


def test_bounded_jobs_stay_within_the_budget_and_all_run() -> None:
    meter = _Meter()
    costs = [3, 3, 3, 0, 0, 5, 1, 1, 9, 2]  # 9 exceeds the budget: it runs alone
    with ThreadPoolExecutor(max_workers=4) as pool:
        _run_bounded(pool, [(c, meter.job(k, c)) for k, c in enumerate(costs)], budget=6)
    assert sorted(meter.ran) == list(range(len(costs)))
    assert meter.peak <= 9
    assert meter.peak_concurrent >= 2  # it does run checks side by side


def test_bounded_jobs_never_exceed_the_budget_when_every_job_fits() -> None:
    meter = _Meter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        _run_bounded(pool, [(4, meter.job(k, 4)) for k in range(8)], budget=8)
    assert meter.peak <= 8 and meter.peak_concurrent == 2


def test_the_first_failure_in_job_order_is_raised_and_queued_jobs_are_cancelled() -> None:
    meter = _Meter()
    jobs = [(1, meter.job(k, 1, fail=k in (2, 5))) for k in range(200)]
    with ThreadPoolExecutor(max_workers=2) as pool, pytest.raises(VerificationError, match="job 2 failed"):
        _run_bounded(pool, jobs, budget=100)
    assert len(meter.ran) < 200  # the jobs still queued behind the failure never ran


@pytest.mark.parametrize(
    ("make", "families"),
    [(gptq_llama, {"float", "affine_int"}), (gguf_llama, {"gguf_block"})],
    ids=["gptq", "gguf"],
)
def test_the_check_cost_estimate_bounds_what_checking_a_weight_allocates(
    make: Callable[[Path], Path], families: set[str], tmp_path: Path, home: Path
) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    digest = ok(store, "push", make(tmp_path / "ck"), "acme/llama:x")["digest"]
    session = Session.open(store)
    manifest = Manifest.from_bytes(session.store.read_blob(digest))
    src = tmp_path / "src"
    src.mkdir()
    for f in manifest.files:
        (src / f.path).symlink_to(session.store.path(blob_key(f.digest)))
    reader = PlaneReader(src)
    by_name = {e.name: e for e in manifest.tensors or []}
    inventory = stored_inventory(by_name.values())
    checked = set()
    for w in manifest.weights or []:
        elements = math.prod(w.shape.extents)
        if elements < 1 << 18:  # small weights: fixed allocations dominate, and they do not matter
            continue
        planes = sum(by_name[p.tensor].end - by_name[p.tensor].start for p in w.planes)
        estimate = check_cost(w, planes)

        def after(w: LogicalWeight = w) -> dict[str, np.ndarray]:  # the de-tiled planes are new arrays
            return {k: v.copy() for k, v in reader.planes(w, by_name).items()}

        tracemalloc.start()
        try:
            _check_weight(w, after, inventory)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= estimate, (w.name, w.contract.family, (peak - planes) / elements)
        checked.add(w.contract.family)
    assert (
        checked == families
    )  # measured beyond the planes: affine ~1.5 bytes per element, float ~0, gguf Q4_1 0.5-0.9
