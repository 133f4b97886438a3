"""The push-time cost of refusing NaN/inf in float tensors (:mod:`shardport.registry.formats.finite`).

    .venv/bin/python bench/bench_finite.py [--mib 100] [--dtype F16|BF16|F32] [--repeat 5] [--out FILE.json]

Writes a llama-like float checkpoint of about ``--mib`` MiB (one safetensors file: embedding, head,
norms and linears of one dtype; the norms F32) and measures, page cache warm, median of ``--repeat``:

* the finiteness scan alone (:func:`check_finite` over every tensor), its bandwidth, and the most
  memory it allocates (``tracemalloc``'s peak: numpy reports its buffers to it) — bounded by the
  chunk, not the file;
* sha256 of the same file (what every push already does once), for scale;
* ``analyze`` (container gates, contracts, semantic gates, the scan), as push runs it.

Prints the JSON document and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from shardport.registry.checkpoint.analysis import analyze
from shardport.registry.formats import parse_safetensors
from shardport.registry.formats.finite import CHUNK_BYTES, StoredFloat, check_finite

HIDDEN, INTER, VOCAB = 1024, 2816, 8000


def build(folder: Path, mib: int, dtype: str) -> int:
    """A float llama checkpoint of about ``mib`` MiB; returns its layer count."""
    size = {"F16": 2, "BF16": 2, "F32": 4}[dtype]
    per_layer = (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER) * size
    layers = max(1, (mib * 2**20 - 2 * VOCAB * HIDDEN * size) // per_layer)
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        if dtype == "F16":
            return a.astype(np.float16)
        if dtype == "BF16":  # the top half of each binary32 (truncated), stored as BF16 below
            return (a.view(np.uint32) >> 16).astype(np.uint16)
        return a

    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "lm_head.weight": w(VOCAB, HIDDEN)}
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in "qkvo":
            tensors[f"{p}self_attn.{proj}_proj.weight"] = w(HIDDEN, HIDDEN)
        tensors[f"{p}mlp.gate_proj.weight"] = w(INTER, HIDDEN)
        tensors[f"{p}mlp.up_proj.weight"] = w(INTER, HIDDEN)
        tensors[f"{p}mlp.down_proj.weight"] = w(HIDDEN, INTER)
        tensors[f"{p}input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[f"{p}post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype == "BF16":  # numpy has no bfloat16: torch writes the same bits as BF16
        import torch
        from safetensors.torch import save_file as save_torch

        save_torch(
            {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == np.uint16
             else torch.from_numpy(v) for k, v in tensors.items()},
            str(folder / "model.safetensors"),
        )  # fmt: skip
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": layers,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return int(layers)


def medians(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """The median seconds of each of ``fns``, run in turn ``repeat`` times (so load drifts evenly)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--dtype", choices=["F16", "BF16", "F32"], default="F16")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ck"
        layers = build(root, args.mib, args.dtype)
        path = root / "model.safetensors"
        size = path.stat().st_size
        tensors = [
            StoredFloat("model.safetensors", r.name, r.start, r.end, r.dtype)
            for r in parse_safetensors(path).tensors
        ]

        def scan() -> int:
            return check_finite(root, tensors, report=lambda e, _: (_ for _ in ()).throw(e))

        def sha() -> str:
            h = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            return h.hexdigest()

        scanned = scan()  # warms the page cache
        sha()
        scan_s, sha_s, analyze_s = medians(
            [scan, sha, lambda: analyze(root, ["config.json", "model.safetensors"])], args.repeat
        )
        tracemalloc.start()
        scan()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    doc = {
        "checkpoint": {"bytes": size, "dtype": args.dtype, "layers": layers, "tensors": len(tensors)},
        "scan_bytes": scanned,
        "scan_seconds": round(scan_s, 4),
        "scan_gib_per_s": round(scanned / scan_s / 2**30, 2),
        "scan_peak_alloc_bytes": peak,
        "chunk_bytes": CHUNK_BYTES,
        "sha256_seconds": round(sha_s, 4),
        "scan_vs_sha256": round(scan_s / sha_s, 3),
        "analyze_seconds": round(analyze_s, 4),
        "scan_share_of_analyze": round(scan_s / analyze_s, 3),
        "repeat": args.repeat,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
