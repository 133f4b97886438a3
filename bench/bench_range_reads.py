"""Per-rank verified range reads at tp 4 vs raw reads and safetensors baselines; prints JSON.

    .venv/bin/python bench/bench_range_reads.py [--size-mib 256] [--tp 4] [--repeat 3] [--out FILE.json]

One safetensors file of llama-shaped F16 matrices (4096 x 4096) goes into a local store with its tile
index. Measured in the same run, on the same file:

* ``page_cache_read_gbps``: sequential ``preadv`` of the whole blob into one reused, page-aligned
  8 MiB buffer (warm); ``cold_read_gbps``: the same after evicting the blob (``POSIX_FADV_DONTNEED``);
* ``blake3_gbps``: 1 MiB tiles hashed on one core and on all cores (thread pool);
* per rank and split axis (row = split rows, col = split byte columns): ``verified`` (our
  :func:`read_slices`), ``raw`` (exact ``preadv`` of the same rectangles, no verification),
  ``st_load_file`` (``safetensors.numpy.load_file`` + narrow) and ``st_get_slice``
  (``safe_open(...).get_slice``), warm; and ``verified`` cold, with the blob's page-cache residency after
  the load (``fincore``) giving the device-level amplification (readahead included);
* ``rss``: peak RSS growth of one rank's verified load in a fresh process vs its assigned bytes and the
  ledger's staging bound.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from blake3 import blake3
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from shardport.loader import PlaneSlice, ReadOptions, read_slices

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from servers import start_seaweedfs

from shardport.registry.formats import parse_safetensors
from shardport.registry.hashing import digest_file
from shardport.registry.manifest import FileEntry, TensorEntry
from shardport.registry.store import Store, blob_key
from shardport.registry.tiles import CheckpointReader, build_tile_index

HIDDEN = 4096


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    out, t_best = None, float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best, out


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path: str) -> int:
    if not shutil.which("fincore"):
        return -1
    out = subprocess.run(
        ["fincore", "-b", "-n", "-o", "RES", path], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[0])


def sequential_read(path: str) -> float:
    buf = mmap.mmap(-1, 8 << 20)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        t, n, at = time.perf_counter(), 1, 0
        while n:
            n = os.preadv(fd, [view], at)
            at += n
        return at / (time.perf_counter() - t) / 1e9
    finally:
        os.close(fd)


def blake3_rates(total: int) -> dict[str, float]:
    data = np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8)
    tiles = [data[k : k + (1 << 20)].data for k in range(0, total, 1 << 20)]
    one, _ = best(lambda: [blake3(t).digest() for t in tiles], 2)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        every, _ = best(lambda: list(pool.map(lambda t: blake3(t).digest(), tiles)), 2)
    return {"one_core": total / one / 1e9, "all_cores": total / every / 1e9, "cores": os.cpu_count() or 1}


def make_checkpoint(root: Path, size_mib: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    count = max(1, size_mib * (1 << 20) // (HIDDEN * HIDDEN * 2))
    arrays = {
        f"model.layers.{k}.weight": rng.integers(0, 1 << 16, (HIDDEN, HIDDEN), dtype=np.uint16).view(
            np.float16
        )
        for k in range(count)
    }
    path = root / "model.safetensors"
    save_file(arrays, str(path))
    return path


def rank_slices(entries: list[TensorEntry], tp: int, rank: int, axis: str) -> list[PlaneSlice]:
    out = []
    for e in entries:
        rows, row_bytes = e.shape[0], (e.end - e.start) // e.shape[0]
        if axis == "row":
            out.append(PlaneSlice(e.name, rank * rows // tp, (rank + 1) * rows // tp, 0, row_bytes))
        else:
            out.append(PlaneSlice(e.name, 0, rows, rank * row_bytes // tp, (rank + 1) * row_bytes // tp))
    return out


def raw_read(blob: str, entries: dict[str, TensorEntry], slices: list[PlaneSlice]) -> list[np.ndarray]:
    """Exact preadv of every rectangle straight into its output, no verification (the floor)."""
    fd = os.open(blob, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    outs = []
    try:
        for s in slices:
            e = entries[s.tensor]
            row_bytes = (e.end - e.start) // e.shape[0]
            out = np.empty(s.shape, np.uint8)
            if s.col0 == 0 and s.col1 == row_bytes:
                os.preadv(fd, [out.data.cast("B")], e.start + s.row0 * row_bytes)
            else:
                for r in range(s.row0, s.row1):
                    os.preadv(fd, [out[r - s.row0].data], e.start + r * row_bytes + s.col0)
            outs.append(out)
    finally:
        os.close(fd)
    return outs


def st_load_file(path: Path, slices: list[PlaneSlice]) -> list[np.ndarray]:
    tensors = load_file(str(path))
    out = []
    for s in slices:
        m = tensors[s.tensor].view(np.uint8).reshape(tensors[s.tensor].shape[0], -1)
        out.append(np.ascontiguousarray(m[s.row0 : s.row1, s.col0 : s.col1]))
    return out


def st_get_slice(path: Path, slices: list[PlaneSlice]) -> list[np.ndarray]:
    out = []
    with safe_open(str(path), framework="numpy") as fh:
        for s in slices:
            part = fh.get_slice(s.tensor)[s.row0 : s.row1, s.col0 // 2 : s.col1 // 2]  # F16 columns
            out.append(np.ascontiguousarray(part).view(np.uint8))
    return out


RSS_SCRIPT = r"""
import json, sys
from pathlib import Path
from shardport.loader import PlaneSlice, read_slices
from shardport.registry.manifest import FileEntry, TensorEntry
from shardport.registry.store import Store
from shardport.registry.tiles import TileIndex
def status(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) * 1024
spec = json.load(open(sys.argv[1]))
index = TileIndex.from_bytes(open(spec["index"], "rb").read())
tensors = [TensorEntry(**e) for e in spec["entries"]]
files = [FileEntry(**f) for f in spec["files"]]
slices = [PlaneSlice(*s) for s in spec["slices"]]
store = Store(spec["store"])
Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS:")
ledger = read_slices(slices, tensors=tensors, files=files, index=index, store=store).ledger
print(json.dumps({"peak_rss_growth_bytes": status("VmHWM:") - before, "assigned_bytes": ledger.bytes_assigned,
                  "staging_bound_bytes": ledger.staging_bound_bytes, "scratch_bytes": ledger.scratch_bytes,
                  "peak_staging_bytes": ledger.peak_staging_bytes}))
"""


def rss_of_rank(tmp: Path, spec: dict[str, Any]) -> dict[str, Any]:
    (tmp / "spec.json").write_text(json.dumps(spec))
    out = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(tmp / "spec.json")], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-s3", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shardport-bench-"))
    try:
        report = run(tmp, args.size_mib, args.tp, args.repeat, s3=not args.skip_s3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def run(tmp: Path, size_mib: int, tp: int, repeat: int, *, s3: bool) -> dict[str, Any]:
    path = make_checkpoint(tmp / "ckpt", size_mib)
    header = parse_safetensors(path)
    entries = [
        TensorEntry(
            name=r.name, file=path.name, start=r.start, end=r.end, dtype=r.dtype, shape=tuple(r.shape)
        )
        for r in header.tensors
    ]
    by_name = {e.name: e for e in entries}
    digest, size = digest_file(path)
    files = [FileEntry(path=path.name, size=size, digest=digest)]
    store = Store(str(tmp / "store"))
    store.upload_blob(path, digest)
    blob = store.path(blob_key(digest))
    t = time.perf_counter()
    with CheckpointReader(path.parent) as reader:
        index = build_tile_index(entries, reader)
    build_s = time.perf_counter() - t
    sequential_read(blob)  # warm the page cache
    report: dict[str, Any] = {
        "file_bytes": size,
        "tp": tp,
        "index": {
            "build_seconds": build_s,
            "build_gbps": size / build_s / 1e9,
            "index_bytes": len(index.to_bytes()),
            "ratio": len(index.to_bytes()) / size,
            "tile_grid": {
                e.name: [index.tensors[e.name].row_block, index.tensors[e.name].col_block]
                for e in entries[:1]
            },
        },
        "page_cache_read_gbps": max(sequential_read(blob) for _ in range(repeat)),
        "blake3_gbps": blake3_rates(256 << 20),
        "ranks": {},
    }

    def verified(slices: list[PlaneSlice]) -> Any:
        return read_slices(
            slices, tensors=entries, files=files, index=index, store=store, options=ReadOptions()
        )

    for axis in ("row", "col"):
        per_rank = []
        for rank in range(tp):
            slices = rank_slices(entries, tp, rank, axis)
            assigned = sum(s.nbytes for s in slices)
            t_ver, result = best(lambda slices=slices: verified(slices), repeat)
            t_raw, raw = best(lambda slices=slices: raw_read(blob, by_name, slices), repeat)
            assert all(np.array_equal(a, b) for a, b in zip(result.arrays, raw, strict=True))
            row = {
                "rank": rank,
                "assigned_bytes": assigned,
                "verified_s": t_ver,
                "verified_gbps": assigned / t_ver / 1e9,
                "raw_s": t_raw,
                "raw_gbps": assigned / t_raw / 1e9,
                "ledger": {k: v for k, v in result.ledger.to_json().items() if k not in ("fetched", "tiles")},
            }
            if rank == 0:
                t_lf, lf = best(lambda slices=slices: st_load_file(path, slices), repeat)
                t_gs, gs = best(lambda slices=slices: st_get_slice(path, slices), repeat)
                assert all(np.array_equal(a, b) for a, b in zip(result.arrays, lf, strict=True))
                assert all(np.array_equal(a, b) for a, b in zip(result.arrays, gs, strict=True))
                row |= {"st_load_file_s": t_lf, "st_get_slice_s": t_gs}
                row |= cold(blob, path, slices, verified)
            per_rank.append(row)
        report["ranks"][axis] = per_rank
    hash_floor = min(report["page_cache_read_gbps"], report["blake3_gbps"]["all_cores"])
    report["summary"] = {
        axis: {
            "verified_gbps_min": min(r["verified_gbps"] for r in rows),
            "raw_gbps_min": min(r["raw_gbps"] for r in rows),
            "verified_vs_floor": min(r["verified_gbps"] for r in rows) / hash_floor,
            "amplification_max": max(r["ledger"]["read_amplification"] for r in rows),
            "speedup_vs_st_load_file": rows[0]["st_load_file_s"] / rows[0]["verified_s"],
            "speedup_vs_st_get_slice": rows[0]["st_get_slice_s"] / rows[0]["verified_s"],
            "plan_share": max(r["ledger"]["seconds"]["plan"] / r["ledger"]["seconds"]["total"] for r in rows),
        }
        for axis, rows in report["ranks"].items()
    }
    evict(blob)
    report["cold_read_gbps"] = sequential_read(blob)
    index_path = tmp / "index.json"
    index_path.write_bytes(index.to_bytes())
    spec = {
        "index": str(index_path),
        "entries": [e.model_dump() for e in entries],
        "files": [f.model_dump() for f in files],
        "slices": [[s.tensor, s.row0, s.row1, s.col0, s.col1] for s in rank_slices(entries, tp, 0, "row")],
        "store": str(tmp / "store"),
    }
    report["rss"] = rss_of_rank(tmp, spec)
    if s3:
        report["seaweedfs"] = seaweed(path, entries, files, index, tp, repeat)
    report["ru_maxrss_bench_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return report


def cold(
    blob: str, path: Path, slices: list[PlaneSlice], verified: Callable[[list[PlaneSlice]], Any]
) -> dict[str, Any]:
    """Rank 0 once more with the blob evicted: time, and what the page cache holds afterwards."""
    assigned = sum(s.nbytes for s in slices)
    evict(blob)
    t = time.perf_counter()
    verified(slices)
    t_cold = time.perf_counter() - t
    held = resident(blob)
    evict(str(path))
    t = time.perf_counter()
    st_get_slice(path, slices)
    t_gs = time.perf_counter() - t
    held_gs = resident(str(path))
    sequential_read(blob)  # warm again for the next measurements
    return {
        "cold_verified_s": t_cold,
        "cold_verified_gbps": assigned / t_cold / 1e9,
        "cold_device_amplification": held / assigned if held >= 0 else None,
        "cold_st_get_slice_s": t_gs,
        "cold_st_get_slice_amplification": held_gs / assigned if held_gs >= 0 else None,
    }


def seaweed(
    path: Path, entries: list[TensorEntry], files: list[FileEntry], index: Any, tp: int, repeat: int
) -> dict[str, Any]:
    """Row-split ranks on SeaweedFS (verified vs plain ``cat_file`` of the same ranges), one column slice."""
    server = start_seaweedfs()
    try:
        os.environ.update(server.env())
        store = Store(f"s3://{server.new_bucket()}/registry")
        store.upload_blob(path, files[0].digest)
        key = store.path(blob_key(files[0].digest))
        by_name = {e.name: e for e in entries}
        out: dict[str, Any] = {"ranks": []}
        for rank in range(tp):
            slices = rank_slices(entries, tp, rank, "row")

            def plain(slices: list[PlaneSlice] = slices) -> None:
                for s in slices:
                    e = by_name[s.tensor]
                    row_bytes = (e.end - e.start) // e.shape[0]
                    a, b = e.start + s.row0 * row_bytes, e.start + s.row1 * row_bytes
                    store.fs.cat_file(key, start=a, end=b)

            t_ver, result = best(
                lambda slices=slices: read_slices(
                    slices, tensors=entries, files=files, index=index, store=store
                ),
                repeat,
            )
            t_plain, _ = best(plain, repeat)
            assigned = result.ledger.bytes_assigned
            out["ranks"].append(
                {
                    "rank": rank,
                    "verified_gbps": assigned / t_ver / 1e9,
                    "plain_cat_file_gbps": assigned / t_plain / 1e9,
                    "requests": result.ledger.requests,
                    "read_amplification": result.ledger.read_amplification,
                }
            )
        one = [s for s in rank_slices(entries, tp, 0, "col")][:1]
        t_col, col = best(lambda: read_slices(one, tensors=entries, files=files, index=index, store=store), 1)
        out["col_one_tensor"] = {
            "seconds": t_col,
            "requests": col.ledger.requests,
            "read_amplification": col.ledger.read_amplification,
        }
        return out
    finally:
        server.stop()


if __name__ == "__main__":
    main()
