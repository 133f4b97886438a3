"""Planning a 405B llama at 16 and 64 nodes, on paper: no weights, no reads; prints JSON.

    .venv/bin/python bench/bench_plan_scale.py [--formats gptq,gguf] [--out FILE.json]

The checkpoint is synthesized, not written: the tensor inventory of a llama with Llama-3.1-405B's
dims (126 layers, hidden 16384, 128 heads / 8 kv heads of 128, intermediate 53248, vocab 128256) as a
GPTQ int4 (group 128, ``qweight``/``qzeros``/``scales``/``g_idx``) or a GGUF (``Q4_K`` matrices, F32
norms) checkpoint lists it, run through the registry's own contract inference
(:func:`infer_safetensors` / :func:`infer_gguf`), laid out in file order into shards of at most 5 GiB
(at tensor boundaries, as the Hugging Face writer shards), then tiled as ``registry convert --layout
tiled`` leaves it: every plane cut at push's split points (:func:`plane_cuts`, :func:`choose_grid`),
stored tile after tile (``shardport-tiled``). The tile index holds those grids; its hashes are
synthetic (BLAKE3 XOF of the tensor name: there are no bytes), so its size is that of a real one.

Then, with the functions bring-up and ``pull --ranks`` run (no reads):

* the driver's plan of the whole job (:func:`shardport.placement.plan`, every rank, as ``registry up``
  plans it): wall and CPU time (best of 3; a busy machine inflates the wall time, not the CPU time)
  and peak Python memory (``tracemalloc``, a separate run), the memory of parsing the manifest it
  plans from, and one node's own plan (``ranks=`` its 8 ranks, as
  :func:`~shardport.loader.rank_load.load_ranks` plans);
* per rank and per node (a node = the 8 ranks of one tp group, one shared read as ``load_ranks`` does):
  the rank's reads → :func:`slices_of` → :func:`schedule_reads` with the S3 profile (``max_gap`` 1 MiB,
  ``request_bytes`` 1 MiB, ``max_amplification`` 8, ``gap_budget`` 0.02, batches of 16 MiB): bytes
  needed (a node: the union of its ranks' rectangles), bytes fetched, S3 requests, and the least
  requests its tiles allow: the maximal contiguous file extents of the tiles covering what it needs
  (``min_requests``; at amplification 1.00 no plan can issue fewer), and the same with no response over
  the 16 MiB batch (``min_requests_batched``: each extent cut into ``ceil(len / 16 MiB)``);
* a predicted time to byte-complete per node: ``requests x latency / streams + bytes / min(S3, NIC)``
  (each of ``streams`` connections serves its share of requests one after another, paying the latency
  for each, while the node's bytes flow at the lesser of its S3 share and its NIC), with S3 at 10 Gb/s
  per node, 20 ms a request, 16 requests in flight and a 100 Gb/s NIC; nodes fetch in parallel (S3 is
  assumed to scale with the nodes: 64 x 10 Gb/s is 80 GB/s from one bucket's prefixes).

64 nodes are ``tp 8 x pp 64``: 126 layers over 64 stages are uneven (:func:`stage_of_layer`: 62 stages
of 2 layers, 2 of 1 — stage 0 also holds the embedding, stage 63 the norm and head), which the planner
supports, and it makes 512 distinct ranks to plan (``tp 8 x pp 16 x dp 4`` would plan the 128 ranks of
the 16-node job again: dp replicas repeat the plan).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from shardport.loader.rank_load import slices_of
from shardport.loader.schedule import PlaneSlice, ReadSchedule, schedule_reads
from shardport.placement import Plan, Topology, plan
from shardport.placement.plan import RankPlan, TensorRead
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, Manifest, ModelInfo, TensorEntry
from shardport.registry.contracts import TensorInfo, infer_gguf, infer_safetensors
from shardport.registry.contracts.encodings import DTYPE_BYTES
from shardport.registry.contracts.gguf_blocks import BLOCK_SIZES
from shardport.registry.store.s3 import S3_PROFILE
from shardport.registry.tiles.grid import choose_grid, plane_layout
from shardport.registry.tiles.layout import LAYOUT
from shardport.registry.tiles.model import TensorTiles, TileIndex
from shardport.registry.tiles.splits import plane_cuts

GIB = 1 << 30
SHARD_BYTES = 5 * GIB
BATCH_BYTES = 16 << 20
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Llama:
    """A dense llama's dims (head_dim = hidden / heads)."""

    layers: int = 126
    hidden: int = 16384
    heads: int = 128
    kv_heads: int = 8
    intermediate: int = 53248
    vocab: int = 128256
    group: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> dict[str, Any]:
        return {
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "hidden_size": self.hidden,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
        }

    def matrices(self) -> list[tuple[str, str, int, int]]:
        """One layer's matrices: (HF module, GGUF name, N, K)."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        return [
            ("self_attn.q_proj", "attn_q", h, h),
            ("self_attn.k_proj", "attn_k", kv, h),
            ("self_attn.v_proj", "attn_v", kv, h),
            ("self_attn.o_proj", "attn_output", h, h),
            ("mlp.gate_proj", "ffn_gate", i, h),
            ("mlp.up_proj", "ffn_up", i, h),
            ("mlp.down_proj", "ffn_down", h, i),
        ]


LLAMA_405B = Llama()


@dataclass(frozen=True)
class Bandwidth:
    """The fetch-time model's constants (see the module docstring)."""

    s3_gbit: float = 10.0
    latency_s: float = 0.020
    streams: int = 16
    nic_gbit: float = 100.0

    def seconds(self, nbytes: int, requests: int) -> float:
        rate = min(self.s3_gbit, self.nic_gbit) * 1e9 / 8
        return requests * self.latency_s / self.streams + nbytes / rate


def gptq_infos(shape: Llama) -> list[TensorInfo]:
    """A GPTQ int4 llama's tensors in file order (desc_act off: ``g_idx`` sequential)."""
    h, g = shape.hidden, shape.group
    out = [TensorInfo("model.embed_tokens.weight", "F16", (shape.vocab, h))]
    for layer in range(shape.layers):
        base = f"model.layers.{layer}"
        out += [TensorInfo(f"{base}.input_layernorm.weight", "F16", (h,))]
        for module, _, n, k in shape.matrices():
            p = f"{base}.{module}"
            out += [
                TensorInfo(f"{p}.qweight", "I32", (k // 8, n)),
                TensorInfo(f"{p}.qzeros", "I32", (k // g, n // 8)),
                TensorInfo(f"{p}.scales", "F16", (k // g, n)),
                TensorInfo(f"{p}.g_idx", "I32", (k,)),
            ]
        out += [TensorInfo(f"{base}.post_attention_layernorm.weight", "F16", (h,))]
    return [
        *out,
        TensorInfo("model.norm.weight", "F16", (h,)),
        TensorInfo("lm_head.weight", "F16", (shape.vocab, h)),
    ]


def gguf_infos(shape: Llama, qtype: str = "Q4_K") -> list[TensorInfo]:
    """A GGUF llama's tensors in file order (every matrix ``qtype``, norms F32)."""
    h = shape.hidden
    out = [TensorInfo("token_embd.weight", qtype, (shape.vocab, h))]
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        out += [TensorInfo(f"{blk}.attn_norm.weight", "F32", (h,))]
        out += [TensorInfo(f"{blk}.{name}.weight", qtype, (n, k)) for _, name, n, k in shape.matrices()]
        out += [TensorInfo(f"{blk}.ffn_norm.weight", "F32", (h,))]
    return [
        *out,
        TensorInfo("output_norm.weight", "F32", (h,)),
        TensorInfo("output.weight", qtype, (shape.vocab, h)),
    ]


def _nbytes(info: TensorInfo) -> int:
    block, size = BLOCK_SIZES.get(info.dtype, (1, DTYPE_BYTES.get(info.dtype, 0)))
    return math.prod(info.shape[:-1]) * (info.shape[-1] // block) * size


def _lay_out(infos: Sequence[TensorInfo], suffix: str, shard: int, header: int = 4096) -> list[TensorEntry]:
    """Tensors back to back in file order, a new shard before one would pass ``shard`` bytes."""
    out: list[TensorEntry] = []
    number, at = 1, header
    for info in infos:
        size = _nbytes(info)
        if at > header and at + size > shard:
            number, at = number + 1, header
        file = f"model-{number:05d}.{suffix}"
        out.append(
            TensorEntry(
                name=info.name, file=file, start=at, end=at + size, dtype=info.dtype, shape=info.shape
            )
        )
        at += size
    return out


def _synthetic_hashes(name: str, count: int) -> tuple[str, ...]:
    raw = blake3(name.encode()).digest(length=32 * count).hex()
    return tuple(raw[k : k + 64] for k in range(0, len(raw), 64))


def synthesize(shape: Llama, fmt: str, shard: int = SHARD_BYTES) -> tuple[Manifest, TileIndex]:
    """The tiled manifest and tile index of ``shape`` as ``fmt`` (``gptq`` or ``gguf``), without bytes."""
    if fmt == "gguf":
        infos = gguf_infos(shape)
        weights = infer_gguf({"general.architecture": "llama"}, infos)
        suffix, params = "gguf", {f"llama.{k}": v for k, v in _gguf_params(shape).items()}
    else:
        infos = gptq_infos(shape)
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "tie_word_embeddings": False,
            "quantization_config": {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": shape.group,
                "desc_act": False,
            },
        }
        weights = infer_safetensors(config, infos)
        suffix, params = "safetensors", shape.params()
    row_major = _lay_out(infos, suffix, shard)
    cuts = plane_cuts(weights, row_major, params)
    entries, tiles = [], {}
    for e in row_major:
        layout = plane_layout(e)
        grid = choose_grid(layout, cuts=cuts.get(e.name))
        file = e.file + ".sptiled"
        entries.append(
            e.model_copy(
                update={
                    "file": file,
                    "layout": LAYOUT,
                    "tile_rows": grid.row_block,
                    "tile_cols": grid.col_block,
                }
            )
        )
        count = max(1, -(-layout.rows // grid.row_block)) * max(1, -(-layout.row_bytes // grid.col_block))
        tiles[e.name] = TensorTiles(
            file=file,
            start=e.start,
            rows=layout.rows,
            row_bytes=layout.row_bytes,
            row_block=grid.row_block,
            col_block=grid.col_block,
            hashes=_synthetic_hashes(e.name, count),
            layout="tiled",
        )
    sizes: dict[str, int] = {}
    for e in entries:
        sizes[e.file] = max(sizes.get(e.file, 0), e.end)
    files = [
        FileEntry(path=p, size=n, digest="sha256:" + blake3(p.encode()).hexdigest()) for p, n in sizes.items()
    ]
    manifest = Manifest(
        container=ContainerInfo(kind=LAYOUT, spec_revision="1"),
        model=ModelInfo(architecture="LlamaForCausalLM" if fmt == "gptq" else "llama", params=params),
        files=files,
        tensors=entries,
        weights=list(weights),
    )
    return manifest, TileIndex(tensors=tiles)


def _gguf_params(shape: Llama) -> dict[str, int]:
    return {
        "block_count": shape.layers,
        "attention.head_count": shape.heads,
        "attention.head_count_kv": shape.kv_heads,
        "embedding_length": shape.hidden,
        "feed_forward_length": shape.intermediate,
        "vocab_size": shape.vocab,
    }


def driver_plan(manifest: Manifest, topology: Topology, repeat: int = 3) -> tuple[Plan, dict[str, Any]]:
    """The driver's plan of every rank: best wall time of ``repeat``, then its peak traced memory."""
    seconds, cpu = [], []
    planned = plan(manifest, topology)
    for _ in range(repeat):
        del planned
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        planned = plan(manifest, topology)
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    del planned
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    planned = plan(manifest, topology)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    node = list(range(GPUS_PER_NODE))
    t0 = time.perf_counter()
    plan(manifest, topology, ranks=node)
    node_seconds = time.perf_counter() - t0
    return planned, {
        "seconds": round(min(seconds), 3),
        "seconds_runs": [round(s, 3) for s in seconds],
        "cpu_seconds": round(min(cpu), 3),
        "peak_traced_bytes": peak - base,
        "held_traced_bytes": held - base,
        "plan_json_bytes": len(planned.to_json()),
        "node_plan_seconds": round(node_seconds, 3),
    }


def _dedupe(reads: Iterable[TensorRead]) -> list[TensorRead]:
    """A rank's reads, each (tensor, index) once (as :func:`load_ranks` passes them on)."""
    seen: set[tuple[str, tuple[tuple[int, int], ...]]] = set()
    out = []
    for r in reads:
        if (r.tensor, r.index) not in seen:
            seen.add((r.tensor, r.index))
            out.append(r)
    return out


def rank_slices(rank: RankPlan, entries: dict[str, TensorEntry]) -> list[PlaneSlice]:
    """The physical rectangles a rank's reads need (what ``load_ranks`` hands the reader)."""
    return [s for r in _dedupe(rank.reads) for s in slices_of(r, entries[r.tensor])]


def union_bytes(slices: Iterable[PlaneSlice]) -> int:
    """Bytes of the union of the rectangles, per tensor by coordinate compression."""
    by_tensor: dict[str, set[tuple[int, int, int, int]]] = {}
    for s in slices:
        if s.nbytes:
            by_tensor.setdefault(s.tensor, set()).add((s.row0, s.row1, s.col0, s.col1))
    total = 0
    for rects in by_tensor.values():
        rows = sorted({r for a, b, _, _ in rects for r in (a, b)})
        cols = sorted({c for _, _, a, b in rects for c in (a, b)})
        covered = set()
        for r0, r1, c0, c1 in rects:
            ri = range(rows.index(r0), rows.index(r1))
            ci = range(cols.index(c0), cols.index(c1))
            covered.update((i, j) for i in ri for j in ci)
        total += sum((rows[i + 1] - rows[i]) * (cols[j + 1] - cols[j]) for i, j in covered)
    return total


def tile_extents(slices: Iterable[PlaneSlice], index: TileIndex) -> list[tuple[str, int, int]]:
    """The maximal contiguous file extents of the tiles covering ``slices`` (touching tiles joined)."""
    spans: set[tuple[str, int, int]] = set()
    for s in slices:
        if not s.nbytes:
            continue
        t = index.tensors[s.tensor]
        i0, i1 = s.row0 // t.row_block, (s.row1 - 1) // t.row_block + 1
        j0, j1 = s.col0 // t.col_block, (s.col1 - 1) // t.col_block + 1
        for i in range(i0, i1):
            first = t.tile_start(i, j0)
            spans.add((t.file, first, t.tile_range(i, j1 - 1)[1]))
    out: list[tuple[str, int, int]] = []
    for file, start, end in sorted(spans):
        if out and out[-1][0] == file and start <= out[-1][2]:
            out[-1] = (file, out[-1][1], max(out[-1][2], end))
        else:
            out.append((file, start, end))
    return out


def schedule(slices: Sequence[PlaneSlice], manifest: Manifest, index: TileIndex) -> ReadSchedule:
    """The loader's read schedule on S3 (``ReadOptions`` defaults with the S3 profile)."""
    return schedule_reads(
        slices,
        manifest.tensors or [],
        manifest.files,
        index,
        batch_bytes=BATCH_BYTES,
        max_gap=S3_PROFILE.max_gap,
        gap_budget=0.02,
        request_bytes=S3_PROFILE.request_bytes,
        max_amplification=S3_PROFILE.max_amplification,
    )


def account(
    slices: Sequence[PlaneSlice], manifest: Manifest, index: TileIndex, bw: Bandwidth
) -> dict[str, Any]:
    """One reader's figures (a rank alone, or a node's shared read): see the module docstring."""
    t0 = time.perf_counter()
    sched = schedule(slices, manifest, index)
    seconds = time.perf_counter() - t0
    needed = union_bytes(slices)
    extents = tile_extents(slices, index)
    tile_bytes = sum(e - s for _, s, e in extents)
    return {
        "bytes_needed": needed,
        "bytes_tiles": tile_bytes,
        "bytes_fetched": sched.bytes_fetched,
        "amplification": sched.bytes_fetched / needed if needed else 1.0,
        "requests": sched.requests,
        "min_requests": len(extents),
        "min_requests_batched": sum(-(-(e - s) // BATCH_BYTES) for _, s, e in extents),
        "tiles": sched.tiles,
        "batches": len(sched.batches),
        "schedule_seconds": seconds,
        "predicted_seconds": bw.seconds(sched.bytes_fetched, sched.requests),
    }


def _spread(rows: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    values = sorted(float(r[key]) for r in rows)
    return {"min": values[0], "median": values[len(values) // 2], "max": values[-1]}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Spread of each figure over ranks or nodes, and the worst requests / minimum ratios."""
    out: dict[str, Any] = {
        k: _spread(rows, k)
        for k in (
            "bytes_needed",
            "bytes_fetched",
            "amplification",
            "requests",
            "min_requests",
            "predicted_seconds",
        )
    }
    out["requests_over_min"] = max(r["requests"] / max(1, r["min_requests"]) for r in rows)
    out["requests_over_min_batched"] = max(r["requests"] / max(1, r["min_requests_batched"]) for r in rows)
    out["bytes_fetched_total"] = sum(r["bytes_fetched"] for r in rows)
    out["requests_total"] = sum(r["requests"] for r in rows)
    out["schedule_seconds_total"] = round(sum(r["schedule_seconds"] for r in rows), 3)
    return out


def node_rows(
    manifest: Manifest, index: TileIndex, planned: Plan, bw: Bandwidth, gpus_per_node: int = GPUS_PER_NODE
) -> tuple[list[dict[str, Any]], dict[int, list[PlaneSlice]]]:
    """Each node's figures (its ranks' slices read together), and every rank's slices."""
    entries = {e.name: e for e in manifest.tensors or []}
    slices = {r.rank: rank_slices(r, entries) for r in planned.ranks}
    nodes = []
    for first in range(0, planned.topology.world_size, gpus_per_node):
        members = range(first, first + gpus_per_node)
        row = account([s for rank in members for s in slices[rank]], manifest, index, bw)
        row["node"] = first // gpus_per_node
        row["sum_rank_bytes_needed"] = sum(union_bytes(slices[r]) for r in members)
        nodes.append(row)
    return nodes, slices


def run_topology(manifest: Manifest, index: TileIndex, topology: Topology, bw: Bandwidth) -> dict[str, Any]:
    """Driver plan, then every node's and every rank's read schedule and figures."""
    planned, driver = driver_plan(manifest, topology)
    nodes, slices = node_rows(manifest, index, planned, bw)
    ranks = [account(slices[r], manifest, index, bw) | {"rank": r} for r in slices]
    largest = max(nodes, key=lambda n: n["bytes_fetched"])
    detail = ("node", "bytes_needed", "bytes_fetched", "requests", "min_requests", "predicted_seconds")
    return {
        "topology": {"tp": topology.tp, "pp": topology.pp, "ep": topology.ep, "dp": topology.dp},
        "nodes": len(nodes),
        "world_size": topology.world_size,
        "stage_layers": sorted({b - a for a, b in planned.stages}),
        "driver_plan": driver,
        "per_node": summarize(nodes),
        "per_rank": summarize(ranks),
        "largest_node_fetch": {
            k: largest[k] for k in ("node", "bytes_fetched", "requests", "predicted_seconds")
        },
        "predicted_job_seconds": max(n["predicted_seconds"] for n in nodes),
        "nodes_detail": [{k: n[k] for k in detail} for n in nodes],
    }


def bench(formats: Sequence[str], setups: Sequence[tuple[str, Topology]], bw: Bandwidth) -> dict[str, Any]:
    """Every format at every setup (see the module docstring)."""
    report: dict[str, Any] = {
        "model": {**LLAMA_405B.params(), "group_size": LLAMA_405B.group},
        "bandwidth_model": {
            "s3_gbit_per_node": bw.s3_gbit,
            "request_latency_s": bw.latency_s,
            "streams": bw.streams,
            "nic_gbit": bw.nic_gbit,
            "formula": "requests * latency / streams + bytes / min(s3, nic)",
        },
        "s3_profile": {
            "max_gap": S3_PROFILE.max_gap,
            "request_bytes": S3_PROFILE.request_bytes,
            "max_amplification": S3_PROFILE.max_amplification,
            "gap_budget": 0.02,
            "batch_bytes": BATCH_BYTES,
        },
        "formats": {},
    }
    for fmt in formats:
        t0 = time.perf_counter()
        manifest, index = synthesize(LLAMA_405B, fmt)
        synth = time.perf_counter() - t0
        raw = index.to_bytes()
        tracemalloc.start()
        parsed = Manifest.model_validate_json(manifest.to_bytes())  # what the driver holds before planning
        manifest_traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del parsed
        checkpoint = sum(e.end - e.start for e in manifest.tensors or [])
        entry: dict[str, Any] = {
            "synthesis_seconds": round(synth, 2),
            "checkpoint_bytes": checkpoint,
            "files": len(manifest.files),
            "tensors": len(manifest.tensors or []),
            "tiles": sum(len(t.hashes) for t in index.tensors.values()),
            "tile_index_bytes": len(raw),
            "tile_index_share": len(raw) / checkpoint,
            "manifest_bytes": len(manifest.to_bytes()),
            "manifest_parse_traced_bytes": {"held": manifest_traced[0], "peak": manifest_traced[1]},
            "setups": {},
        }
        for name, topology in setups:
            entry["setups"][name] = run_topology(manifest, index, topology, bw)
        report["formats"][fmt] = entry
    report["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return report


SETUPS = (("16_nodes", Topology(tp=8, pp=16)), ("64_nodes", Topology(tp=8, pp=64)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="gptq,gguf")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = bench(args.formats.split(","), SETUPS, Bandwidth())
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
