"""Whole-process peak memory of ``registry convert --layout tiled`` at two checkpoint sizes; prints JSON.

    .venv/bin/python bench/bench_convert_memory.py [--layers 2 12] [--gguf-layers 4] [--label NAME]
        [--out bench/results/convert-memory.json [--merge]]

Llama-shaped float16 safetensors checkpoints of the same shapes (hidden 1024, intermediate 4096, 2 kv
heads of 128, vocab 8192; one file per layer plus one for the embeddings and head, as
:func:`bench_rank_pull.make_llama` writes them) that differ only in their number of layers (``--layers``:
~90 MiB at 2, ~380 MiB at 12), so the largest tensor (the 16 MiB embedding) is the same
at both sizes; and, with ``--gguf-layers`` > 0, one GGUF (Q8_0 linear weights, float32 norms) of the
same shapes. Each is pushed to a local store (in this process), then converted by the CLI as a user
runs it, ``registry --store S convert REF NAME:TAG --layout tiled``, in a separate process.

The peak is that process's whole resident high-water mark (anonymous and file-backed pages, every
thread): a fresh, small wrapper process starts the CLI and collects it with ``os.wait4``, whose
``ru_maxrss`` is the CLI process's alone (Linux seeds a child's ``ru_maxrss`` with its parent's resident
size at the fork, so the parent is that small wrapper, not this benchmark holding the checkpoint). Each
row reports the peak against the bound of the issue, 256 MiB plus the largest tensor's tiles (its
stored bytes), and the converted manifest digest. The tile index is metadata the conversion holds
whole (parsed, as every reader of it does): its count of tiles grows with the checkpoint, so each row
also gives the resident size the parsed index adds in a fresh process (``tile_index_rss_mib``) and the
peak less it. ``--label`` names the code measured (the results of a
run before the streaming change are kept under ``before`` for reference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_range_reads import cli, in_scratch
from bench_rank_pull import make_llama

HIDDEN, INTER, KV, VOCAB = 1024, 4096, 256, 8192
MIB = 1 << 20
BASE_BOUND = 256 * MIB
"""The issue's bound, on top of the largest tensor's tiles."""

#: Runs in a fresh interpreter: starts the CLI, waits for it, prints its own peak and the CLI's.
_WRAPPER = """
import json, os, resource, subprocess, sys, time
t = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
out = child.stdout.read()
_, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"status": status, "child_peak_kib": usage.ru_maxrss, "seconds": time.perf_counter() - t,
                  "wrapper_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "cpu_seconds": usage.ru_utime + usage.ru_stime, "stdout": out.decode()}))
"""


#: Runs in a fresh interpreter: the resident size the parsed tile index of ARGV[2] in store ARGV[1] adds.
_INDEX_RSS = """
import json, sys
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.session import Session
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.resolve import resolve

def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS"))

session = Session.open(sys.argv[1])
manifest = resolve(session, parse_ref(sys.argv[2])).manifest
raw = session.store.read_blob(manifest.tile_index.digest)
before = rss()
index = TileIndex.from_bytes(raw)
after = rss()
tiles = sum(len(t.hashes) for t in index.tensors.values())
print(json.dumps({"tiles": tiles, "index_bytes": len(raw), "index_rss_bytes": after - before}))
"""


def registry_exe() -> str:
    """The ``registry`` console script of this interpreter's environment."""
    exe = Path(sys.executable).parent / "registry"
    if not exe.exists():
        raise SystemExit(f"{exe}: not found (install the package: pip install -e .)")
    return str(exe)


def make_gguf(folder: Path, layers: int) -> int:
    """A llama GGUF of the benchmark's shapes (Q8_0 linear weights and embeddings); its tensor bytes."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HIDDEN // 128)
    w.add_head_count_kv(KV // 128)
    w.add_vocab_size(VOCAB)
    q8 = gguf.GGMLQuantizationType.Q8_0
    total = 0

    def add(name: str, shape: tuple[int, ...]) -> None:
        nonlocal total
        data = quantize((rng.standard_normal(shape, dtype=np.float32) * 0.02), q8)
        w.add_tensor(name, data, raw_dtype=q8)
        total += data.nbytes

    add("token_embd.weight", (VOCAB, HIDDEN))
    shapes = {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (KV, HIDDEN),
        "attn_v": (KV, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INTER, HIDDEN),
        "ffn_up": (INTER, HIDDEN),
        "ffn_down": (HIDDEN, INTER),
    }
    for layer in range(layers):
        for stem, shape in shapes.items():
            add(f"blk.{layer}.{stem}.weight", shape)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    add("output.weight", (VOCAB, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return total


def measure(store: str, source: str, target: str) -> dict[str, Any]:
    """``registry convert`` in its own process (under a fresh wrapper): its peak RSS, time and answer."""
    cmd = [registry_exe(), "--store", store, "--json", "convert", source, target, "--layout", "tiled"]
    done = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], check=True, capture_output=True, text=True)
    got = json.loads(done.stdout)
    if got["status"] != 0:
        raise SystemExit(f"convert failed ({got['status']}): {got['stdout']}")
    return got


def case(tmp: Path, name: str, folder: Path, tensor_bytes: int) -> dict[str, Any]:
    """Push ``folder``, convert it in a separate process, and report its peak against the bound."""
    store = str(tmp / f"store-{name}")
    if not (tmp / "home" / "keys").exists():
        cli("--store", store, "keygen")
    pushed = cli("--store", store, "push", str(folder), f"bench/{name}:src")
    os.sync()  # the pushed blobs' writeback would otherwise compete with the conversion's writes
    got = measure(store, f"bench/{name}:src", f"bench/{name}:tiled")
    answer = json.loads(got["stdout"])
    manifest = cli("--store", store, "inspect", f"bench/{name}:src")["manifest"]
    largest = max(t["end"] - t["start"] for t in manifest["tensors"])
    files = sum(f["size"] for f in manifest["files"])
    peak = got["child_peak_kib"] * 1024
    bound = BASE_BOUND + largest
    index = json.loads(
        subprocess.run(
            [sys.executable, "-c", _INDEX_RSS, store, f"bench/{name}:src"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return {
        "checkpoint": name,
        "checkpoint_bytes": files,
        "tensor_bytes": tensor_bytes,
        "tensors": len(manifest["tensors"]),
        "largest_tensor_bytes": largest,
        "peak_rss_bytes": peak,
        "peak_rss_mib": round(peak / MIB, 1),
        "bound_bytes": bound,
        "bound_mib": round(bound / MIB, 1),
        "within_bound": peak <= bound,
        "tiles": index["tiles"],
        "tile_index_bytes": index["index_bytes"],
        "tile_index_rss_mib": round(index["index_rss_bytes"] / MIB, 1),
        "peak_rss_less_tile_index_mib": round((peak - index["index_rss_bytes"]) / MIB, 1),
        "peak_over_checkpoint": round(peak / files, 3),
        "wrapper_peak_rss_mib": round(got["wrapper_peak_kib"] / 1024, 1),
        "seconds": round(got["seconds"], 2),
        "cpu_seconds": round(got["cpu_seconds"], 2),
        "source_digest": pushed["digest"],
        "converted_digest": answer["digest"],
    }


def run(tmp: Path, layers: list[int], gguf_layers: int, label: str) -> dict[str, Any]:
    rows = []
    for n in layers:
        folder = tmp / f"llama-{n}"
        total = make_llama(folder, n, hidden=HIDDEN, inter=INTER, kv=KV, vocab=VOCAB)
        rows.append(case(tmp, f"f16-{n}l", folder, total))
    if gguf_layers > 0:
        folder = tmp / f"gguf-{gguf_layers}"
        rows.append(case(tmp, f"q8_0-gguf-{gguf_layers}l", folder, make_gguf(folder, gguf_layers)))
    return {
        "bench": "convert_memory",
        "label": label,
        "shapes": {"hidden": HIDDEN, "intermediate": INTER, "kv_dim": KV, "vocab": VOCAB},
        "bound": "peak whole-process RSS <= 256 MiB + the largest tensor's tiles (its stored bytes)",
        "measure": "ru_maxrss of the `registry convert` process (os.wait4 in a fresh wrapper process)",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "all_within_bound": all(r["within_bound"] for r in rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 12])
    p.add_argument("--gguf-layers", type=int, default=4)
    p.add_argument("--label", default="streaming")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--merge", action="store_true", help="add this run to --out under its label")
    args = p.parse_args()
    if args.merge and args.out and args.out.exists():
        previous = json.loads(args.out.read_text())
        holder: dict[str, Any] = {}

        def bench(tmp: Path) -> dict[str, Any]:
            report = run(tmp, args.layers, args.gguf_layers, args.label)
            holder.update(previous if "runs" in previous else {"runs": {previous["label"]: previous}})
            holder.setdefault("runs", {})[args.label] = report
            return holder

        in_scratch("shardport-convert-memory-", bench, args.out)
        return
    in_scratch(
        "shardport-convert-memory-",
        lambda tmp: {"runs": {args.label: run(tmp, args.layers, args.gguf_layers, args.label)}},
        args.out,
    )


if __name__ == "__main__":
    main()
