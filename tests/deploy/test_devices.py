"""Where ranks run (bundle, device, backend), the device-memory check of L5, and the memory chart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from shardport.deploy.cluster import Cluster
from shardport.deploy.devices import (
    GRAPH_DEVICES,
    RankDevice,
    backend_for,
    bundle_spec,
    device_memory,
    kernel_device,
    rank_device,
    torch_device,
    visible_cuda,
)
from shardport.deploy.errors import ClusterError
from shardport.deploy.report import write_report
from shardport.deploy.up_l5 import DEVICE_SLACK, device_check, level5
from shardport.kernels import FallbackPolicy

MIB = 1 << 20


def test_a_gpu_per_rank_only_when_the_cluster_has_one_for_every_rank() -> None:
    assert bundle_spec(gpus=4, cpus=16, world=4) == {"GPU": 1.0, "CPU": 1.0}
    assert bundle_spec(gpus=8, cpus=2, world=4) == {"GPU": 1.0, "CPU": 0.5}
    assert bundle_spec(gpus=1, cpus=2, world=4) == {"CPU": 0.5}  # too few GPUs: none asked for
    assert bundle_spec(gpus=0, cpus=64, world=2) == {"CPU": 1.0}
    assert bundle_spec(gpus=0, cpus=0, world=3) == {"CPU": 0.01}
    assert Cluster(address=None, started_here=False, gpus=2, cpus=8).bundle(2) == {"GPU": 1.0, "CPU": 1.0}
    with pytest.raises(ValueError, match="world size 0"):
        bundle_spec(gpus=1, cpus=1, world=0)


def test_backend_and_device_follow_what_the_rank_sees_and_the_graph_runs_on() -> None:
    assert backend_for("cuda") == "nccl" and backend_for("cpu") == "gloo"
    h200 = rank_device(["NVIDIA H200", "NVIDIA H200"], graph_devices=("cpu", "cuda"))
    assert h200 == RankDevice("cuda", 0, "NVIDIA H200") and h200.backend == "nccl"
    assert str(h200) == "cuda:0 NVIDIA H200"
    assert rank_device([], graph_devices=("cpu", "cuda")) == RankDevice("cpu")
    # the graph computes on CUDA: a rank that sees a GPU runs there with NCCL; one that sees none, gloo
    assert GRAPH_DEVICES == ("cpu", "cuda")
    on_gpu_node = rank_device(["NVIDIA H200"])
    assert str(on_gpu_node) == "cuda:0 NVIDIA H200" and on_gpu_node.backend == "nccl"
    assert torch_device(on_gpu_node) == torch.device("cuda", 0)
    assert torch_device(rank_device([])) == torch.device("cpu")
    # a graph restricted to the CPU keeps a rank given a GPU on the CPU, and says so
    held = rank_device(["NVIDIA H200"], graph_devices=("cpu",))
    assert str(held) == "cpu" and held.backend == "gloo"


def test_the_kernels_see_this_cpu_and_a_cuda_device_only_where_torch_can_use_it() -> None:
    device = kernel_device(RankDevice("cpu"))
    assert device.kind == "cpu" and device.isa
    assert device_memory(RankDevice("cpu")) == (0, 0)
    cuda = RankDevice("cuda", 0, "some GPU")
    if visible_cuda():  # a GPU machine: its compute capability goes to admission
        assert kernel_device(cuda).kind == "cuda" and kernel_device(cuda).cc is not None
    else:
        with pytest.raises(ClusterError, match="cuda:0 some GPU: torch cannot use this CUDA device"):
            kernel_device(cuda)


def _ledger(**extra: int) -> dict[str, int]:
    return {"prepared_operators": 100 * MIB, "float_tensors": 10 * MIB, "kv_cache": 2 * MIB, **extra}


def test_device_memory_is_checked_against_the_prepared_operators_on_cuda_ranks() -> None:
    cpu = device_check("cpu", _ledger(device_resident=0, device_peak=0))
    assert cpu["passed"] is None and cpu["status"] == "not applicable" and "no device memory" in cpu["detail"]
    wrong = device_check("cpu", _ledger(device_resident=MIB, device_peak=MIB))
    assert wrong["passed"] is False and wrong["status"] == "fail"  # a CPU rank has none to report
    gpu = "cuda:0 NVIDIA H200"
    held = device_check(gpu, _ledger(device_resident=120 * MIB, device_peak=300 * MIB))
    assert held["passed"] and held["operators"] == 100 * MIB and held["bound"] == 224 * MIB + DEVICE_SLACK
    short = device_check(gpu, _ledger(device_resident=60 * MIB, device_peak=60 * MIB))
    assert not short["passed"]  # the ledger claims operators the device does not hold
    extra = device_check(gpu, _ledger(device_resident=224 * MIB + DEVICE_SLACK + 1, device_peak=0))
    assert not extra["passed"]  # a persistent copy beyond the ledger
    assert device_check(gpu, {})["passed"]  # nothing prepared, nothing held


def _report(rank: int, device: str, resident: int) -> dict[str, Any]:
    ledger = _ledger(device_resident=resident, device_peak=resident, host_resident_growth=MIB)
    return {"rank": rank, "dispatch": [], "full_dequant_persistent": [], "ledger": ledger, "device": device}


def test_level5_fails_a_cuda_rank_whose_device_memory_misses_the_ledger() -> None:
    policy = FallbackPolicy()
    good = level5([_report(0, "cpu", 0), _report(1, "cuda:0 NVIDIA H200", 150 * MIB)], policy)
    assert good["passed"] and good["device"]["1"]["passed"] and good["device"]["0"]["device"] == "cpu"
    bad = level5([_report(0, "cuda:0 NVIDIA H200", 10 * MIB)], policy)
    assert not bad["passed"] and not bad["device"]["0"]["passed"]
    older = level5([{k: v for k, v in _report(0, "cpu", 0).items() if k != "device"}], policy)
    assert older["passed"] and older["device"]["0"]["device"] == "cpu"  # a report without a device: CPU


BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.mark.slow
def test_the_memory_chart_draws_every_measure_and_says_when_a_rank_has_no_device(tmp_path: Path) -> None:
    measures = {"bytes_assigned": 8 * MIB, "bytes_fetched": 8 * MIB, "host_resident": 300 * MIB}
    evidence = {
        "ledger": {"0": {"codes_and_qparams": 8 * MIB, "repack_workspace_peak": MIB}, "1": {"kv_cache": MIB}},
        "memory": {
            "0": {**measures, "host_resident_growth": 40 * MIB, "device_resident": 0, "device_peak": 0},
            "1": {**measures, "device_resident": 9 * MIB, "device_peak": 12 * MIB},
        },
        "devices": {"0": "cpu", "1": "cuda:0 NVIDIA H200"},
    }
    page = write_report(evidence, tmp_path / "report.html")
    assert BROWSER is not None, "no headless Chromium: scripts/test.sh installs chromium-headless-shell"
    flags = ["--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"]
    dom = subprocess.run([BROWSER, *flags, page.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-charts="drawn"' in dom.stdout
    keys = re.findall(r'<rect[^>]*class="bar"[^>]*data-key="([a-z_]+)"', dom.stdout)
    # rank 0: disk, fetched, host, growth, workspace; rank 1: disk, fetched, host, device resident, peak
    both = ["bytes_assigned", "bytes_fetched", "host_resident"]
    rank0 = [*both, "host_resident_growth", "repack_workspace_peak"]
    assert sorted(keys) == sorted([*rank0, *both, "device_resident", "device_peak"])
    assert dom.stdout.count(">none (cpu)</text>") == 2 and ">rank 1 on cuda:0 NVIDIA H200<" in dom.stdout
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []
