"""Multi-node tests: two Ray nodes on this machine, each in a network namespace (see ``netns.py``).

Every test under this folder carries the ``multinode`` marker (``pytest -m multinode`` runs them
alone); they also run with the rest of the suite.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from netns import FAST_HEALTH, TwoNodeCluster, leftovers, two_node_cluster

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.multinode)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodeCluster]:
    """A two-node cluster (2 CPUs a node, the fast health check) shared by one test module.

    Torn down after the module; the teardown fails the module if a namespace, a process started in
    one, or the cluster's folder is left.
    """
    with two_node_cluster(tmp_path_factory.mktemp("two-nodes"), system_config=FAST_HEALTH) as cluster:
        yield cluster
        seen = cluster.processes("a") + cluster.processes("b")
    left = leftovers(cluster, seen)
    assert not left, f"the two-node cluster's teardown left: {left}"
