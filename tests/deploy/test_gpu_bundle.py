"""A cluster with a GPU for every rank: each rank's bundle holds one GPU (``{"GPU": 1}``), on CPU hardware.

Ray lets a node declare GPUs it does not have; a rank actor then gets its own GPU id (and
``CUDA_VISIBLE_DEVICES``) while torch, a CPU build here, sees no device, so the rank computes on the CPU
with gloo and its evidence says so. The test runs in its own process: the session's Ray has no GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import gptq_tiny
from llama_artifacts import ok

DRIVER = """
import json, shutil, sys, tempfile
import ray
from shardport.deploy.up import UpRequest, bring_up, ray_launcher
from shardport.registry.session import Session

store = sys.argv[1]
temp = tempfile.mkdtemp(prefix="sp-ray-", dir="/tmp")
ray.init(num_cpus=2, num_gpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
         log_to_driver=False, object_store_memory=80 * 1024 * 1024, _temp_dir=temp)
try:
    request = UpRequest(ref="llama/gptq:v1", tokens=(1, 5, 300), steps=2, tp=2, store=store, ladder=False)
    result = bring_up(Session.open(store), request, launcher=ray_launcher(None), store_evidence=False)
    groups = [g for g in ray.util.placement_group_table().values() if g.get("state") != "REMOVED"]
    p = result.predicate
    print(json.dumps({"gpus": p["gpus"], "devices": p["devices"], "late": [
        r["status"] != "fail" for r in p["parity"] if r["level"] in ("L4", "L5")], "groups_left": len(groups),
        "l5_device": p["l5"]["device"]}))
finally:
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_gpu_per_rank_places_each_rank_on_its_own_gpu(home: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    ok(store, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, store], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(g for ids in doc["gpus"].values() for g in ids) == ["0", "1"]  # one GPU each
    assert doc["devices"] == {"0": "cpu", "1": "cpu"}  # torch sees no CUDA device: CPU and gloo
    assert all(v["status"] == "not applicable" and v["resident"] == 0 for v in doc["l5_device"].values())
    assert doc["late"] and all(doc["late"]) and doc["groups_left"] == 0
