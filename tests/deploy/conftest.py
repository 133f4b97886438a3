"""One Ray for the deploy tests' session (bound to 127.0.0.1), and a check that each test leaks nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray head on loopback: 4 logical CPUs on a 2-core machine, 80 MiB object store."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["SHARDPORT_RAY_AUTH"] = "disabled"  # the explicit opt-in: a test head runs without a token
    import ray

    temp = tempfile.mkdtemp(prefix="sp-ray-", dir="/tmp")
    ray.init(
        num_cpus=4,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 * 1024 * 1024,
        _temp_dir=temp,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def alive_actors() -> list[Any]:
    """Actors the GCS still lists as alive (read from the GCS; the state API needs the dashboard)."""
    from ray._private import state

    return [a for a in state.actors().values() if a.get("State") not in ("DEAD",)]


def live_groups() -> list[Any]:
    """Placement groups not removed."""
    import ray

    return [g for g in ray.util.placement_group_table().values() if g.get("state") != "REMOVED"]


@pytest.fixture
def ray_ranks(ray_cluster: Any) -> Iterator[Any]:
    """The session's Ray; after the test, no actor is alive and no placement group is left."""
    yield ray_cluster
    leaked = alive_actors()
    groups = live_groups()
    assert not leaked, f"actors left alive: {leaked}"
    assert not groups, f"placement groups left: {groups}"
