"""Push/pull throughput of the registry vs plain copies, on the local store and SeaweedFS S3.

    .venv/bin/python bench/bench_registry.py [--size-mib 1024] [--files 8] [--out FILE.json]

Baselines in the same run: ``cp -r`` (local) and plain s3fs ``put``/``get`` (SeaweedFS on 127.0.0.1).
Ours hash every file (sha256), sign the manifest and tag document, verify while downloading.
Page cache is warm for both sides (this machine cannot drop caches); each number is the best of
``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import start_seaweedfs

from shardport.cli import run


def make_checkpoint(root: Path, size: int, files: int) -> None:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    per = size // files
    for i in range(files):
        with open(root / f"model-{i:05d}-of-{files:05d}.bin", "wb") as fh:
            left = per
            while left:
                n = min(left, 16 << 20)
                fh.write(os.urandom(n))
                left -= n


def timed(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def registry(*argv: str) -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run(["--json", *argv])
    out: dict[str, Any] = json.loads(buf.getvalue())
    if code != 0:
        raise RuntimeError(out)
    return out


def hash_all(root: Path) -> None:
    def one(p: Path) -> None:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, [p for p in root.iterdir() if p.is_file()]))


def bench_store(
    label: str, store: str, src: Path, work: Path, repeat: int, baseline_put: Any, baseline_get: Any
) -> dict[str, Any]:
    size = sum(p.stat().st_size for p in src.iterdir())
    res: dict[str, Any] = {"bytes": size}
    res["baseline_put_s"] = timed(baseline_put, repeat)
    res["baseline_get_s"] = timed(baseline_get, repeat)
    pushes = []
    for i in range(repeat):
        target = f"{store}-{i}" if not store.startswith("s3://") else f"{store}{i}"
        t = time.perf_counter()
        out = registry("--store", target, "push", str(src), "bench/model:v1")
        pushes.append((time.perf_counter() - t, target, out))
    res["push_s"], best_store, first = min(pushes, key=lambda x: x[0])
    assert first["uploaded_bytes"] == size, first
    t = time.perf_counter()
    again = registry("--store", best_store, "push", str(src), "bench/model:v1")
    res["repush_s"] = time.perf_counter() - t
    res["repush_uploaded_bytes"] = again["uploaded_bytes"]

    def pull() -> None:
        dest = work / f"pull-{label}"
        shutil.rmtree(dest, ignore_errors=True)
        registry("--store", best_store, "pull", "bench/model:v1", str(dest))

    res["pull_s"] = timed(pull, repeat)
    res["push_vs_baseline"] = res["baseline_put_s"] / res["push_s"]
    res["pull_vs_baseline"] = res["baseline_get_s"] / res["pull_s"]
    res["repush_fraction_of_push"] = res["repush_s"] / res["push_s"]
    res["push_MBps"] = size / res["push_s"] / 1e6
    res["pull_MBps"] = size / res["pull_s"] / 1e6
    res["baseline_put_MBps"] = size / res["baseline_put_s"] / 1e6
    res["baseline_get_MBps"] = size / res["baseline_get_s"] / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardport-bench-", dir=os.environ.get("BENCH_DIR")))
    os.environ["SHARDPORT_HOME"] = str(work / "home")
    results: dict[str, Any] = {"size_mib": args.size_mib, "files": args.files, "cpus": os.cpu_count()}
    try:
        src = work / "ckpt"
        make_checkpoint(src, args.size_mib << 20, args.files)
        registry("keygen")
        results["sha256_all_files_s"] = timed(lambda: hash_all(src), args.repeat)

        def cp_put() -> None:
            shutil.rmtree(work / "cp-put", ignore_errors=True)
            subprocess.run(["cp", "-r", str(src), str(work / "cp-put")], check=True)

        def cp_get() -> None:
            shutil.rmtree(work / "cp-get", ignore_errors=True)
            subprocess.run(["cp", "-r", str(work / "cp-put"), str(work / "cp-get")], check=True)

        results["local"] = bench_store("local", str(work / "store"), src, work, args.repeat, cp_put, cp_get)
        shutil.rmtree(work / "cp-put", ignore_errors=True)
        shutil.rmtree(work / "cp-get", ignore_errors=True)
        if not args.skip_s3:
            server = start_seaweedfs()
            try:
                os.environ.update(server.env())
                import s3fs

                fs = s3fs.S3FileSystem(skip_instance_cache=True)
                base = server.new_bucket()
                ours = server.new_bucket()

                def s3_put() -> None:
                    fs.put(str(src), f"{base}/ckpt", recursive=True)

                def s3_get() -> None:
                    shutil.rmtree(work / "s3-get", ignore_errors=True)
                    fs.get(f"{base}/ckpt", str(work / "s3-get"), recursive=True)

                results["seaweedfs"] = bench_store(
                    "s3", f"s3://{ours}/r", src, work, args.repeat, s3_put, s3_get
                )
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
