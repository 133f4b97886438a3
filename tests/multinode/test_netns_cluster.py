"""The two-node test cluster itself: two alive nodes on their private addresses, one task on each, gloo
across them, a killed raylet seen dead, token authentication on, and nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from netns import (
    FAST_HEALTH,
    PREFIX,
    ClusterStartError,
    NodeNet,
    TwoNodeCluster,
    leftovers,
    sweep_stale,
    two_node_cluster,
)

DRIVERS = Path(__file__).parent / "ray_drivers.py"


def _driver(cluster: TwoNodeCluster, tmp_path: Path, *args: str) -> list[str]:
    """The argv of a driver of ``ray_drivers.py`` run in A, its result written under ``tmp_path``."""
    return [cluster.python, str(DRIVERS), str(tmp_path / f"{args[0]}.json"), *args]


def _result(done: subprocess.CompletedProcess[str], tmp_path: Path, what: str) -> dict[str, Any]:
    assert done.returncode == 0, (
        f"driver exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    out: dict[str, Any] = json.loads((tmp_path / f"{what}.json").read_text())
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def test_two_alive_nodes_on_private_addresses(two_nodes: TwoNodeCluster) -> None:
    nodes = two_nodes.ray_nodes()
    assert sorted(n["address"] for n in nodes if n["alive"]) == [two_nodes.a.address, two_nodes.b.address]
    assert len({n["id"] for n in nodes}) == 2, nodes
    for node in two_nodes.nodes:  # the address exists in its namespace only
        shown = subprocess.run(["ip", "-n", node.netns, "-br", "addr"], capture_output=True, text=True)
        assert f"{node.address}/24" in shown.stdout, shown.stdout
    here = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    assert two_nodes.a.address not in here and two_nodes.b.address not in here


def test_token_auth_is_on_with_the_clusters_own_token(two_nodes: TwoNodeCluster) -> None:
    env = _environ(two_nodes.raylet("b").pid)
    assert env.get("RAY_AUTH_MODE") == "token"
    assert env.get("RAY_AUTH_TOKEN_PATH") == str(two_nodes.token_path)
    assert "SHARDPORT_RAY_AUTH" not in env and "RAY_ADDRESS" not in env
    assert oct(two_nodes.token_path.stat().st_mode & 0o777) == "0o600"
    # a driver holding another token is turned away (Ray retries the GCS once a second for 20 s by
    # default, auth errors included: one try here)
    join = f"import ray; ray.init(address={two_nodes.head_address!r}, log_to_driver=False)"
    wrong = {"RAY_AUTH_TOKEN": "0" * 64, "RAY_gcs_server_port_wait_time_s": "1"}
    done = two_nodes.run_in_head([two_nodes.python, "-c", join], env=wrong, timeout=60)
    assert done.returncode != 0, done.stdout[-1000:]
    assert "InvalidAuthToken" in done.stderr, done.stderr[-2000:]


def test_one_task_per_node_and_gloo_across_nodes(two_nodes: TwoNodeCluster, tmp_path: Path) -> None:
    ifaces = {n.address: n.iface for n in two_nodes.nodes}
    argv = _driver(two_nodes, tmp_path, "spread", two_nodes.head_address, json.dumps(ifaces))
    out = _result(two_nodes.run_in_head(argv, timeout=150), tmp_path, "spread")
    ids = two_nodes.node_ids()
    tasks = out["tasks"]
    assert sorted(t["ip"] for t in tasks) == [two_nodes.a.address, two_nodes.b.address]
    assert sorted(t["node_id"] for t in tasks) == sorted(ids.values())
    assert out["driver_ip"] == two_nodes.a.address
    ranks = out["ranks"]
    assert [r["ip"] for r in ranks] == [two_nodes.a.address, two_nodes.b.address]
    for r in ranks:  # 1 + 2 and 10 + 20, each rank's own contribution from its own node
        assert r["sum"] == [3.0, 30.0], r
        assert r["gathered"] == [two_nodes.a.address, two_nodes.b.address], r


def _watch_death(cluster: TwoNodeCluster, node: NodeNet, tmp_path: Path) -> float:
    """Kill ``node``'s raylet; seconds until a driver in A sees the GCS report it dead."""
    driver = cluster.popen_in_head(
        _driver(cluster, tmp_path, "watch", cluster.head_address, node.address, "60")
    )
    assert driver.stdout is not None
    for line in driver.stdout:  # Ray may print on the driver's stdout too
        if line.strip() == "connected":
            break
    else:
        pytest.fail(f"the watching driver ended before it connected: {driver.communicate()}")
    killed_at = time.time()
    cluster.kill_raylet(node.label)
    stdout, stderr = driver.communicate(timeout=90)
    out = _result(
        subprocess.CompletedProcess(driver.args, driver.returncode, stdout, stderr), tmp_path, "watch"
    )
    assert isinstance(out["dead_at"], float), f"node {node.address} still alive after 60 s: {out}"
    return float(out["dead_at"]) - killed_at


def test_killed_raylet_is_reported_dead(two_nodes: TwoNodeCluster, tmp_path: Path) -> None:
    """The module's last test on ``two_nodes``: node B stays dead (the fixture's teardown still ends all)."""
    seconds = _watch_death(two_nodes, two_nodes.b, tmp_path)
    health = FAST_HEALTH
    bound = (health["health_check_period_ms"] * health["health_check_failure_threshold"]) / 1000
    bound += health["health_check_timeout_ms"] / 1000 + 5.0  # one probe's timeout, 5 s of slack
    assert seconds < bound, (
        f"node B reported dead {seconds:.1f} s after its raylet was killed (bound {bound} s)"
    )
    print(f"raylet of B killed: reported dead after {seconds:.2f} s")
    nodes = {n["address"]: n["alive"] for n in two_nodes.ray_nodes()}
    assert nodes == {two_nodes.a.address: True, two_nodes.b.address: False}


def test_a_failed_start_is_torn_down_and_says_why(tmp_path: Path) -> None:
    # Ray starts the head's GCS, then refuses the raylet's resources: the GCS must be ended
    with pytest.raises(ClusterStartError, match=r"`ray start` in spn-\d+-[0-9a-f]+-a .* exited 1") as failed:
        with two_node_cluster(tmp_path, cpus_per_node=-1) as cluster:
            pytest.fail(f"a cluster of -1 CPUs a node came up: {cluster}")
    assert "Resource quantities must be nonnegative" in str(failed.value), failed.value
    cluster = failed.value.cluster
    assert cluster.ended, "no process was ended: the GCS did not start?"
    assert leftovers(cluster) == []
    assert _processes_mentioning(str(cluster.folder)) == []
    assert list((tmp_path / "ray-logs").glob("*/gcs_server.out")), "the GCS's log was not kept"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            cmdline = proc.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in cmdline:
                found.append(f"{proc.parent.name}: {cmdline[:100]}")
    return found


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def test_stale_namespaces_are_swept_and_live_ones_kept() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, live = f"{PREFIX}-{gone.pid}-0000aa-a", f"{PREFIX}-{os.getpid()}-0000bb-a"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        swept = sweep_stale()
        listed = _namespaces()
        assert stale in swept and stale not in listed
        assert live not in swept and live in listed
    finally:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
