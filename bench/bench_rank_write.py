"""Whole-process cost of ``registry pull REF DEST --tp 4 --rank 1`` against a plain safetensors script.

    .venv/bin/python bench/bench_rank_write.py [--size-mib 1024] [--tp 4] [--rank 1] [--repeat 3]
        [--profile FILE.prof] [--out FILE.json]

A llama-shaped float16 checkpoint of about ``--size-mib`` MiB (hidden 2048, intermediate 5632, kv 512;
as many layers as fit, the vocabulary filling the rest) is pushed to a local store and its blobs are
read once (warm page cache). Then, alternating, ``--repeat`` times each, both as fresh processes:

* ``pull``: the real CLI, ``registry --store S --json pull REF DEST --tp T --rank R`` (resolve, tile
  index, placement, verified reads, witness check, the rank file written in one pass and re-read, plan
  and ledger files, all staged and renamed into place);
* ``baseline``: a script that opens the same blobs with ``safetensors.safe_open(...).get_slice`` for the
  same pieces (taken from the pull's rank file metadata) and writes them with
  ``safetensors.numpy.save_file`` (same names, same metadata: the two files must be byte-identical).

Wall time is measured around each process; peak memory is the child's own maximum resident set
(GNU ``/usr/bin/time -f %M``; file pages it maps count). Goals (issue 16): pull wall ≤ 1.0x the
baseline's, pull peak ≤ assigned bytes + 64 MiB. The idle footprint of each interpreter (``registry
--help``; ``import numpy, safetensors``; the modules a pull imports) and the pull's import time are
reported too, so the cost above start-up can be read off.
``--profile`` runs one more pull under cProfile and writes its stats.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 1 << 20
HIDDEN, INTER, KV = 2048, 5632, 512
REF = "bench/write:f16"


def _baseline(spec_path: str, out: str) -> None:
    """The baseline process: ``get_slice`` every piece of the spec, then one ``save_file``."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    spec = json.loads(Path(spec_path).read_text())
    arrays = {}
    by_blob: dict[str, list[dict[str, Any]]] = {}
    for piece in spec["pieces"]:
        by_blob.setdefault(piece["blob"], []).append(piece)
    for blob, pieces in by_blob.items():
        with safe_open(blob, framework="numpy") as f:
            for piece in pieces:
                index = tuple(slice(lo, hi) for lo, hi in piece["index"])
                arrays[piece["name"]] = f.get_slice(piece["tensor"])[index]
    save_file(arrays, out, metadata=spec["metadata"])


def run_child(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` as a child; its wall seconds, its own peak RSS (MiB) and its stdout.

    The peak is GNU time's ``%M``: a child forked straight from this (large) process would inherit its
    high-water mark across ``exec``. Children run with byte-code caching on (as an installed package
    has its ``.pyc`` files), whatever ``PYTHONDONTWRITEBYTECODE`` says here.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.NamedTemporaryFile("r") as peak:
        t = time.perf_counter()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv], capture_output=True, text=True, env=env
        )
        seconds = time.perf_counter() - t
        if done.returncode != 0:
            raise RuntimeError(f"{argv[:5]}... exited {done.returncode}: {done.stderr[-2000:]}")
        return {"seconds": seconds, "peak_mib": int(peak.read().split()[-1]) / 1024, "stdout": done.stdout}


def split_safetensors(path: Path) -> tuple[dict[str, Any], str]:
    """A safetensors file's parsed header and the sha256 of its data section."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), hashlib.sha256(raw[8 + n :]).hexdigest()


def shape_for(size: int, tp: int) -> tuple[int, int]:
    """(layers, vocab) of the llama shape above whose checkpoint is closest to ``size`` bytes."""
    layer = 2 * (HIDDEN * HIDDEN * 2 + KV * HIDDEN * 2 + INTER * HIDDEN * 3 + 2 * HIDDEN)
    per_token = 2 * 2 * HIDDEN  # embedding and head rows
    layers = max(1, (size - 4096 * per_token) // layer)
    step = 64 * tp
    vocab = max(step, (size - layers * layer - 2 * HIDDEN) // per_token // step * step)
    return int(layers), int(vocab)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best and median wall seconds and peak MiB of ``runs``."""
    secs = [r["seconds"] for r in runs]
    peaks = [r["peak_mib"] for r in runs]
    return {
        "seconds": secs,
        "seconds_best": min(secs),
        "seconds_median": statistics.median(secs),
        "peak_mib": peaks,
        "peak_mib_max": max(peaks),
        "peak_mib_median": statistics.median(peaks),
    }


def bench(tmp: Path, size: int, tp: int, rank: int, repeat: int, profile: Path | None) -> dict[str, Any]:
    from bench_range_reads import cli, sequential_read
    from bench_rank_pull import make_llama
    from safetensors import safe_open

    from shardport.registry.artifact.manifest import Manifest
    from shardport.registry.session import Session
    from shardport.registry.store.keys import blob_key

    layers, vocab = shape_for(size, tp)
    total = make_llama(tmp / "ckpt", layers, hidden=HIDDEN, inter=INTER, kv=KV, vocab=vocab)
    store = str(tmp / "store")
    cli("--store", store, "keygen")
    pushed = cli("--store", store, "push", str(tmp / "ckpt"), REF)
    session = Session.open(store)
    manifest = Manifest.from_bytes(session.store.read_blob(pushed["digest"]))
    blobs = [
        str(session.store.path(blob_key(f.digest))) for f in manifest.files if f.path.endswith(".safetensors")
    ]
    shutil.rmtree(tmp / "ckpt")
    os.sync()
    registry = str(Path(sys.executable).with_name("registry"))
    pull_argv = [registry, "--store", store, "--json", "pull", REF, str(tmp / "pull"), "--tp", str(tp)]
    pull_argv += ["--rank", str(rank)]
    base_argv = [
        sys.executable,
        __file__,
        "--baseline",
        str(tmp / "spec.json"),
        str(tmp / "base.safetensors"),
    ]

    def fresh() -> None:
        shutil.rmtree(tmp / "pull", ignore_errors=True)
        Path(tmp / "base.safetensors").unlink(missing_ok=True)
        os.sync()  # the last run's writeback must not compete with the next
        for b in blobs:
            sequential_read(b)

    fresh()
    first = run_child(pull_argv)  # warm-up; its rank file names the pieces the baseline reads
    answer = json.loads(first["stdout"])
    rank_file = Path(answer["out"])
    where = {}
    for blob in blobs:
        with safe_open(blob, framework="numpy") as f:
            where.update({key: blob for key in f.keys()})
    with safe_open(str(rank_file), framework="numpy") as f:
        metadata = f.metadata()
        names = list(f.keys())
    pieces = []
    for name in names:
        piece = json.loads(metadata[f"shardport.slice.{name}"])
        tensor = name.split("@")[0]
        pieces.append({"name": name, "tensor": tensor, "blob": where[tensor], "index": piece["index"]})
    (tmp / "spec.json").write_text(json.dumps({"pieces": pieces, "metadata": metadata}))
    pull_file = split_safetensors(rank_file)
    fresh()
    run_child(base_argv)  # warm-up
    base_file = split_safetensors(tmp / "base.safetensors")

    pulls, bases = [], []
    for _ in range(repeat):
        fresh()
        pulls.append(run_child(pull_argv))
        fresh()
        bases.append(run_child(base_argv))
    ledger = json.loads(pulls[-1]["stdout"])["ledger"]
    idle_pull = run_child([registry, "--help"])["peak_mib"]
    idle_base = run_child([sys.executable, "-c", "import numpy, safetensors.numpy"])["peak_mib"]
    pull_imports = "import shardport.cli.fetch, shardport.loader.rank_pull, shardport.registry.trust.resolve"
    imports = run_child([sys.executable, "-c", pull_imports])
    assigned = int(ledger["bytes_assigned"])
    p, b = summary(pulls), summary(bases)
    for r in pulls + bases:
        r.pop("stdout")
    report: dict[str, Any] = {
        "checkpoint_bytes": total,
        "layers": layers,
        "vocab": vocab,
        "tp": tp,
        "rank": rank,
        "repeat": repeat,
        "cores": os.cpu_count(),
        "bytes_assigned": assigned,
        "assigned_mib": assigned / MIB,
        # the library writes its metadata in hash order: the headers are compared parsed
        "rank_file_same_header_and_bytes_as_baseline": pull_file == base_file,
        "pull": p,
        "baseline": b,
        "idle_peak_mib": {
            "registry_help": idle_pull,
            "python_numpy_safetensors": idle_base,
            "pull_modules_imported": imports["peak_mib"],
        },
        "pull_import_seconds": imports["seconds"],
        "pull_in_process": {
            k: ledger.get(k)
            for k in (
                *("seconds_plan", "seconds_read", "seconds_total", "seconds", "requests", "direct_bytes"),
                *("mapped_bound_bytes", "peak_staging_bytes", "scratch_bytes", "tiles_verified"),
            )
        },
        "wall_ratio_median": p["seconds_median"] / b["seconds_median"],
        "wall_ratio_best": p["seconds_best"] / b["seconds_best"],
        "pull_peak_over_assigned_mib": p["peak_mib_max"] - assigned / MIB,
        "baseline_peak_over_assigned_mib": b["peak_mib_max"] - assigned / MIB,
    }
    report["goal_wall_le_1x"] = report["wall_ratio_median"] <= 1.0
    report["goal_peak_le_assigned_plus_64mib"] = report["pull_peak_over_assigned_mib"] <= 64
    if profile:
        fresh()
        prof_argv = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "shardport.cli"]
        report["profiled_seconds"] = run_child(prof_argv + pull_argv[1:])["seconds"]
    return report


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--baseline":
        _baseline(sys.argv[2], sys.argv[3])
        return
    from bench_range_reads import in_scratch

    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    size = args.size_mib * MIB
    in_scratch(
        "shardport-writebench-",
        lambda tmp: bench(tmp, size, args.tp, args.rank, args.repeat, args.profile),
        args.out,
    )


if __name__ == "__main__":
    main()
