"""Row-major column pieces from S3: requests and seconds of ``load_rank`` with and without request pricing.

    .venv/bin/python bench/bench_s3_row_major.py [--layers 2] [--repeat 3] [--out FILE.json]

Two bring-up checkpoints at hidden 576 (``tests/bringup_artifacts.py``: the GGUF mix, and GPTQ group 32)
are pushed as their producers lay them out (row-major) to a local store and to a SeaweedFS S3 server on
127.0.0.1, and converted to the tiled layout there for reference. Rank 1's ``load_rank`` at tp 3 and 4
(GGUF) and tp 4 (GPTQ) is timed (best of ``--repeat``) from S3:

* ``unpriced``: ``ReadOptions(request_bytes=0)``, the fetch plan of a local store (only the 2 % gap
  budget bridges): a rank that needs part of every matrix row asks for each row's piece apart;
* ``priced``: the S3 profile's request cost (``ReadProfile.request_bytes``, ``max_amplification``);
* ``tiled``: the tiled artifact with the S3 profile.

Each row reports the ledger's requests, bytes fetched and read amplification; every load's arrays are
checked equal to the local store's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_range_reads import cli, in_scratch
from bringup_artifacts import WIDE, gguf_mix, quantized_llama
from servers import start_seaweedfs

from shardport.loader import RankTensors, ReadOptions, load_rank
from shardport.placement import Topology
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.session import Session

CASES = (("gguf", 3), ("gguf", 4), ("gptq", 4))


def best(fn: Callable[[], RankTensors], repeat: int) -> tuple[float, RankTensors]:
    """The fastest of ``repeat`` calls and its result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    assert result is not None
    return min(times), result


def row(seconds: float, loaded: RankTensors) -> dict[str, Any]:
    ledger = loaded.ledger
    return {
        "seconds": round(seconds, 4),
        "requests": ledger.requests,
        "bytes_assigned": ledger.bytes_assigned,
        "bytes_fetched": ledger.bytes_fetched,
        "read_amplification": round(ledger.read_amplification, 3),
    }


def run(tmp: Path, layers: int, repeat: int) -> dict[str, Any]:
    shape = dataclasses.replace(WIDE, layers=layers)
    sources = {
        "gguf": gguf_mix(tmp / "gguf", shape),
        "gptq": quantized_llama(tmp / "gptq", "gptq", 32, shape),
    }
    local = str(tmp / "store")
    cli("--store", local, "keygen")
    for name, src in sources.items():
        cli("--store", local, "push", str(src), f"wide/{name}:v1")
    server = start_seaweedfs()
    report: dict[str, Any] = {"layers": layers, "hidden": shape.hidden, "repeat": repeat, "cases": []}
    try:
        os.environ.update(server.env())
        s3 = f"s3://{server.new_bucket()}/registry"
        for name, src in sources.items():
            cli("--store", s3, "push", str(src), f"wide/{name}:v1")
            cli("--store", s3, "convert", f"wide/{name}:v1", f"wide/{name}:tiled", "--layout", "tiled")
        here, there = Session.open(local), Session.open(s3)
        for name, tp in CASES:
            topology = Topology(tp=tp)
            want = load_rank(here, parse_ref(f"wide/{name}:v1"), topology, 1).arrays
            case: dict[str, Any] = {"checkpoint": name, "tp": tp, "rank": 1}
            for label, ref, options in (
                ("unpriced", f"wide/{name}:v1", ReadOptions(request_bytes=0)),
                ("priced", f"wide/{name}:v1", None),
                ("tiled", f"wide/{name}:tiled", None),
            ):
                seconds, loaded = best(
                    lambda ref=ref, options=options, topology=topology: load_rank(
                        there, parse_ref(ref), topology, 1, options=options
                    ),
                    repeat,
                )
                got = loaded.arrays
                assert got.keys() == want.keys() and all(
                    got[k].tobytes() == want[k].tobytes() for k in want
                ), f"{name} tp {tp} {label}: arrays differ from the local store's"
                case[label] = row(seconds, loaded)
            case["requests_saved"] = case["unpriced"]["requests"] / case["priced"]["requests"]
            case["speedup"] = case["unpriced"]["seconds"] / case["priced"]["seconds"]
            report["cases"].append(case)
    finally:
        server.stop()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    in_scratch("s3-row-major-", lambda tmp: run(tmp, args.layers, args.repeat), args.out)


if __name__ == "__main__":
    main()
