"""``registry up --address`` on a real two-node Ray cluster (two network namespaces on this machine).

A tiny GGUF llama at tp 2 x pp 2, two ranks per node: from the local store (the namespaces share the
file system) and from SeaweedFS running inside the head's namespace on its private address. Greedy
tokens and logits equal the single-node bring-up (the embedded head, in the same namespace); each node
read its ranks' union once; the evidence lists both nodes. Then node B's raylet is killed while its
first rank reads: the attempt ends naming the node and its ranks, ``--retries 1`` relaunches on node A
alone, and nothing is left (no actor, placement group or private folder). The node-loss test goes
last: the cluster has one node after it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bringup_artifacts import gguf_tiny
from netns import BIN, TwoNodeCluster
from safetensors.numpy import load_file
from servers import ACCESS_KEY, SECRET_KEY

PROMPT = "1,5,300,7,396"
REF = "llama/gguf:v1"
TOPOLOGY = ("--tp", "2", "--pp", "2")

#: a driver in A: what the cluster still holds (alive actors, placement groups not removed)
_LEFT = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
actors = [a for a in state.actors().values() if a.get("State") != "DEAD"]
groups = [g for g in ray.util.placement_group_table().values() if g.get("state") != "REMOVED"]
print(json.dumps({"actors": len(actors), "groups": len(groups)}))
"""


def _registry(
    cluster: TwoNodeCluster, env: dict[str, str], *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return cluster.run_in_head([str(BIN / "registry"), "--json", *args], env=env, timeout=timeout)


def _doc(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.fixture(scope="module")
def pushed(two_nodes: TwoNodeCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The GGUF pushed to a local store, and its single-node bring-up (the embedded head, in A)."""
    root = tmp_path_factory.mktemp("up-two-nodes")
    home, store = root / "home", root / "store"
    env = {"SHARDPORT_HOME": str(home)}
    model = gguf_tiny(root / "gguf")
    _doc(_registry(two_nodes, env, "--store", str(store), "keygen"))
    _doc(_registry(two_nodes, env, "--store", str(store), "push", str(model), REF))
    logits = root / "single.safetensors"
    single = _doc(
        _registry(
            two_nodes, env, "--store", str(store), "up", REF, *TOPOLOGY, "--tokens", PROMPT,
            "--generate", "3", "--no-evidence", "--logits-out", str(logits),
        )
    )  # fmt: skip
    return {"root": root, "env": env, "store": str(store), "model": model, "single": single, "logits": logits}


def _up_two_nodes(
    two_nodes: TwoNodeCluster, pushed: dict[str, Any], store: str, env: dict[str, str], name: str
) -> dict[str, Any]:
    logits = pushed["root"] / f"{name}.safetensors"
    doc = _doc(
        _registry(
            two_nodes, env, "--store", store, "up", REF, "--address", two_nodes.head_address, *TOPOLOGY,
            "--tokens", PROMPT, "--generate", "3", "--logits-out", str(logits),
        )
    )  # fmt: skip
    assert doc["passed"] is True, [r for r in doc["parity"] if r["status"] == "fail"]
    assert doc["generated"] == pushed["single"]["generated"]
    np.testing.assert_array_equal(
        load_file(str(logits))["logits"], load_file(str(pushed["logits"]))["logits"]
    )
    ids = two_nodes.node_ids()
    nodes = doc["placement"]["nodes"]
    assert [(n["node"], n["address"], n["ranks"]) for n in nodes] == [
        (ids["a"], two_nodes.a.address, [0, 1]),
        (ids["b"], two_nodes.b.address, [2, 3]),
    ]
    for n in nodes:  # one read of the node's union, by its first rank; the other rank fetched nothing
        first, other = (str(r) for r in n["ranks"])
        assert n["reads"] == 1 and 0.5 <= n["read_amplification"] <= 1.06, n
        assert n["bytes_fetched"] == doc["memory"][first]["bytes_fetched"] > 0
        assert doc["memory"][other]["bytes_fetched"] == 0
    assert doc["placement"]["tp_spans_nodes"] is False
    return doc


def test_up_across_two_nodes_from_the_local_store(two_nodes: TwoNodeCluster, pushed: dict[str, Any]) -> None:
    single_nodes = pushed["single"]["placement"]["nodes"]
    assert (
        len(single_nodes) == 1 and single_nodes[0]["ranks"] == [0, 1, 2, 3] and single_nodes[0]["reads"] == 1
    )
    doc = _up_two_nodes(two_nodes, pushed, pushed["store"], pushed["env"], "local")
    assert doc["evidence"]  # signed and stored: registry verify recomputes it
    verified = _doc(_registry(two_nodes, pushed["env"], "--store", pushed["store"], "verify", REF))
    assert verified["evidence_verified"] >= 1


def _seaweedfs_in_head(two_nodes: TwoNodeCluster, folder: Path) -> tuple[subprocess.Popen[str], str]:
    """SeaweedFS inside A on A's private address (the ranks on B reach it over the veth)."""
    host = two_nodes.a.address
    ports = [18333, 19333, 18080, 18888]  # a fresh namespace: only Ray's ports are taken there
    s3, master, volume, filer = ports
    folder.mkdir()
    server = two_nodes.popen_in_head(
        [
            str(BIN / "weed"), "mini", f"-dir={folder}", f"-ip={host}", f"-ip.bind={host}", "-webdav=false",
            "-admin.ui=false", "-master.telemetry=false", f"-s3.port={s3}", f"-master.port={master}",
            f"-volume.port={volume}", f"-filer.port={filer}",
        ],
        env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=folder,
    )  # fmt: skip
    return server, f"http://{host}:{s3}"


_BUCKET = """
import sys, time, boto3
client = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
deadline = time.monotonic() + 90
while True:
    try:
        client.create_bucket(Bucket=sys.argv[2]); break
    except Exception:
        if time.monotonic() > deadline: raise
        time.sleep(0.5)
"""


def test_up_across_two_nodes_from_s3_served_in_the_head_namespace(
    two_nodes: TwoNodeCluster, pushed: dict[str, Any]
) -> None:
    server, endpoint = _seaweedfs_in_head(two_nodes, pushed["root"] / "weed")
    try:
        bucket = f"t-{secrets.token_hex(6)}"
        env = {
            **pushed["env"],
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
        made = two_nodes.run_in_head(
            [two_nodes.python, "-c", _BUCKET, endpoint, bucket], env=env, timeout=120
        )
        assert made.returncode == 0, made.stderr[-2000:]
        store = f"s3://{bucket}/registry"
        _doc(_registry(two_nodes, env, "--store", store, "push", str(pushed["model"]), REF))
        _up_two_nodes(two_nodes, pushed, store, env, "s3")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_losing_a_node_mid_fetch_names_it_relaunches_on_the_survivor_and_leaves_nothing(
    two_nodes: TwoNodeCluster, pushed: dict[str, Any]
) -> None:
    resume = pushed["root"] / "resume"
    env = {
        **pushed["env"],
        "SHARDPORT_FAILPOINT": "rank2-fetch:pause",
        "SHARDPORT_FAILPOINT_RESUME": str(resume),
    }
    argv = [
        str(BIN / "registry"), "--json", "--store", pushed["store"], "up", REF, "--address",
        two_nodes.head_address, *TOPOLOGY, "--tokens", PROMPT, "--generate", "3", "--no-evidence",
        "--retries", "1",
    ]  # fmt: skip
    driver = two_nodes.popen_in_head(argv, env=env)
    try:
        paused = Path(f"{resume}.paused")
        deadline = time.monotonic() + 120
        while not paused.exists():  # rank 2 (node B's first rank) is at its node's read
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "rank 2 never reached its fetch"
            time.sleep(0.1)
        two_nodes.kill_raylet("b")
        resume.touch()  # the relaunch's rank 2 passes its fetch at once
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, (out[-2000:], err[-3000:])
    doc = json.loads(out)
    lost, relaunched = doc["attempts"]
    assert lost["outcome"] == "lost" and lost["stage"] == "fetch", lost
    assert f"({two_nodes.b.address}) was lost during fetch: ranks [2, 3] ran on it" in lost["reason"], lost
    # --retries 1: the relaunch is placed on the surviving node (four CPU shares of its two CPUs)
    assert relaunched["outcome"] == "ok"
    assert [(n["address"], n["ranks"], n["reads"]) for n in doc["placement"]["nodes"]] == [
        (two_nodes.a.address, [0, 1, 2, 3], 1)
    ]
    assert doc["generated"] == pushed["single"]["generated"]
    left = two_nodes.run_in_head([two_nodes.python, "-c", _LEFT, two_nodes.head_address], timeout=90)
    assert left.returncode == 0, left.stderr[-2000:]
    assert json.loads(left.stdout.strip().splitlines()[-1]) == {"actors": 0, "groups": 0}
    owners = {p: p / "owner.pid" for p in Path("/tmp").glob("sp-ray-*")}
    mine = [p for p, o in owners.items() if o.exists() and o.read_text().split()[:1] == [str(driver.pid)]]
    assert mine == [], mine  # the bring-up's private folder went with it
    assert os.path.exists(pushed["store"])
