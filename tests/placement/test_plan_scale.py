"""The 405B planning bench's synthesis and accounting, at a tiny scale (4 layers, tp 2 x pp 2).

``bench/bench_plan_scale.py`` plans a weightless checkpoint and reports bytes and requests per rank
and per node; here the same code runs on a small llama and its figures are checked against quantities
computed another way: the checkpoint's own byte count, the plan's reads, the files the stages lie in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_plan_scale import Bandwidth, Llama, node_rows, synthesize, tile_extents

from shardport.placement import Topology, plan
from shardport.registry.tiles.layout import LAYOUT

TINY = Llama(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1024, vocab=1000, group=128)
TP, PP = 2, 2


@pytest.mark.parametrize("fmt", ["gptq", "gguf"])
def test_tiny_plan_accounting(fmt: str) -> None:
    manifest, index = synthesize(TINY, fmt, shard=1 << 20)
    tensors = manifest.tensors or []
    assert len(manifest.files) > 1, "the shard size should split the tiny checkpoint over several files"
    assert all(e.layout == LAYOUT and index.tensors[e.name].layout == "tiled" for e in tensors)
    assert {e.name for e in tensors} == set(index.tensors)
    planned = plan(manifest, Topology(tp=TP, pp=PP))
    nodes, slices = node_rows(manifest, index, planned, Bandwidth(), gpus_per_node=TP)
    assert len(nodes) == PP
    checkpoint = sum(e.end - e.start for e in tensors)
    # every tensor lies in exactly one stage: the nodes' needs partition the checkpoint
    assert sum(n["bytes_needed"] for n in nodes) == checkpoint
    for node in nodes:
        ranks = planned.ranks[node["node"] * TP : (node["node"] + 1) * TP]
        distinct = {(r.tensor, r.index): r.nbytes for rank in ranks for r in rank.reads}
        assert node["bytes_needed"] == sum(distinct.values())  # the union, from the plan's reads
        assert node["sum_rank_bytes_needed"] == sum(r.bytes_assigned for r in ranks)
        assert node["bytes_fetched"] == node["bytes_tiles"] == node["bytes_needed"]
        assert node["amplification"] == 1.0
        # a stage's tensors are one contiguous run in each file it touches
        stage_files = {r.file for rank in ranks for r in rank.reads}
        assert node["min_requests"] == len(stage_files)
        assert node["requests"] >= node["min_requests_batched"] >= node["min_requests"]
    for rank in planned.ranks:
        extents = tile_extents(slices[rank.rank], index)
        assert sum(e - s for _, s, e in extents) >= rank.bytes_assigned


def test_predicted_seconds() -> None:
    bw = Bandwidth(s3_gbit=8.0, latency_s=0.02, streams=4, nic_gbit=16.0)
    # 100 requests x 20 ms over 4 streams = 0.5 s; 1e9 bytes at min(8, 16) Gb/s = 1 s
    assert bw.seconds(10**9, 100) == pytest.approx(1.5)
    assert Bandwidth(s3_gbit=100.0, nic_gbit=8.0, streams=1, latency_s=0.0).seconds(
        10**9, 1
    ) == pytest.approx(1.0)
