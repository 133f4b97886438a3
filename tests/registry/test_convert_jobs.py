"""Convert's validation runs its checks on a pool with a bound on the decodes in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from shardport.registry.convert import _run_bounded
from shardport.registry.errors import VerificationError


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
