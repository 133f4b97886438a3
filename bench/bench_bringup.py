"""Bring-up of a quantized llama GGUF at tp 4 on CPU ranks: ``registry up`` vs the naive per-rank load.

    .venv/bin/python bench/bench_bringup.py [--size quick|full] [--generate 8] [--out FILE.json]

A llama-family GGUF (hidden 2048, intermediate 5632, 16 heads of 128, 4 kv heads, vocab 32000; Q4_0
linears, Q8_0 ``attn_v`` and tied Q8_0 token embedding, F32 norms) is written (~1 GiB at ``--size full``,
~170 MiB at ``--size quick``; block bytes are random with small positive scales, which is all the load
path and the kernels see) and pushed to a local store. Then, one run each:

* ``registry up REF --tp 4`` as a user would time it: the CLI as a subprocess with ``--json`` and its
  stderr on a pseudo-terminal, so its per-rank progress lines ("prepare done") are timestamped here.
  Time to first token = launch -> last rank's "prepare done" + max over ranks of (warm-up + first token)
  from the ranks' timelines; the CLI's wall time to exit (which adds decode, the driver's float32
  reference check and the signed evidence) is reported too. Peak host memory per rank: the ranks'
  ``host_peak`` (each process's own high-water mark, ``VmHWM``; ``host_resident``, the RSS after
  generation, is reported beside it), and
  the CLI driver's own peak (``/usr/bin/time -f %M``; it holds the float32 reference).
* the same through ``bring_up`` with ``--activations bfloat16`` (ladder ``sample``): the quantized
  operators run torch's int4pack fast path in bfloat16 (the graph around them stays float32), and its
  ratios vs (a) and (b) beside the float32 ones.
* the same through ``bring_up`` on an existing Ray cluster (``ray start --head`` on 127.0.0.1 before the
  clock starts; ``registry up --address``), as on a cluster that is already running: no head start-up.
* (a) the naive baseline: 4 processes at once, each reading the whole checkpoint (``gguf.GGUFReader``),
  dequantizing every tensor (``gguf.quants.dequantize``), narrowing to its tp slice and running the
  prompt through a torch llama forward with gloo all-reduces on 127.0.0.1: time to first token (launch
  -> the last rank's logits) and each process's peak RSS (``VmHWM`` from
  ``/proc/self/status``; not ``ru_maxrss``, which Linux carries over from the parent across
  ``fork``/``exec``, so a child of this benchmark would report at least the benchmark's own peak).
* (b) transformers loading the same GGUF (``from_pretrained(gguf_file=…)``) and one forward, if it runs
  in this environment; otherwise the reason is recorded.
* decode tokens/s at tp 1, 2 and 4 (``registry up --generate K``; rank 0's decode seconds from the
  signed evidence).

Writes the JSON document (ratios included) to ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pty
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN, INTER, HEADS, KV_HEADS, VOCAB = 2048, 5632, 16, 4, 32000
HEAD_DIM = HIDDEN // HEADS
PROMPT = (1, 17, 42, 300, 7)
REGISTRY = str(Path(sys.executable).parent / "registry")
SIZES = {"quick": 170 * 2**20, "full": 2**30}


# --- the checkpoint --------------------------------------------------------------------------------


def _blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    """Random GGUF blocks of ``qtype`` for a ``[rows, cols]`` weight: random codes, small f16 scales."""
    per, size, scale = {"Q4_0": (32, 18, 0.005), "Q8_0": (32, 34, 0.0003)}[qtype]
    nb = cols // per
    raw = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, size=(rows, nb)) * scale).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * size)


def layer_bytes() -> int:
    q4 = (HIDDEN * HIDDEN * 2 + KV_HEADS * HEAD_DIM * HIDDEN + 3 * INTER * HIDDEN) * 18 // 32
    return q4 + KV_HEADS * HEAD_DIM * HIDDEN * 34 // 32


def make_gguf(folder: Path, layers: int) -> int:
    """Write ``folder/model.gguf``; return its size in bytes."""
    import gguf

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_name("bench llama")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(layers)
    w.add_feed_forward_length(INTER)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_vocab_size(VOCAB)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q4, q8 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", _blocks(rng, VOCAB, HIDDEN, "Q8_0"), raw_dtype=q8)
    kv = KV_HEADS * HEAD_DIM
    shapes = {
        "attn_q": (HIDDEN, HIDDEN, "Q4_0"),
        "attn_k": (kv, HIDDEN, "Q4_0"),
        "attn_v": (kv, HIDDEN, "Q8_0"),
        "attn_output": (HIDDEN, HIDDEN, "Q4_0"),
        "ffn_gate": (INTER, HIDDEN, "Q4_0"),
        "ffn_up": (INTER, HIDDEN, "Q4_0"),
        "ffn_down": (HIDDEN, INTER, "Q4_0"),
    }
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for stem, (n, k, qt) in shapes.items():
            w.add_tensor(
                f"blk.{layer}.{stem}.weight", _blocks(rng, n, k, qt), raw_dtype=q4 if qt == "Q4_0" else q8
            )
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return (folder / "model.gguf").stat().st_size


# --- registry up -----------------------------------------------------------------------------------


def registry(env: dict[str, str], store: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [REGISTRY, "--store", store, "--json", *args], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"registry {' '.join(args)}: exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
        )
    return dict(json.loads(out.stdout))


def pty_run(
    argv: list[str], env: dict[str, str], timeout: float = float("inf")
) -> tuple[int, str, list[tuple[float, str]], float]:
    """Run ``argv`` with stderr on a pty (its lines timestamped from launch) and stdout to a file.

    Stdout goes to a file, not a pipe: the ``--json`` document of a large model outgrows a pipe's
    buffer, and this loop drains only the pty until the process ends. Returns the exit status, stdout,
    the timestamped stderr lines and the wall time; the process is killed after ``timeout`` seconds.
    """
    master, slave = pty.openpty()
    out_file = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=out_file, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    events: list[tuple[float, str]] = []
    buf = b""
    while True:
        if time.perf_counter() - t0 > timeout:
            proc.kill()
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            now = time.perf_counter() - t0
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                events.append((now, line.decode(errors="replace").strip()))
        elif proc.poll() is not None:
            break
    proc.wait()
    wall = time.perf_counter() - t0
    os.close(master)
    out_file.seek(0)
    stdout = out_file.read().decode()
    out_file.close()
    return proc.returncode, stdout, events, wall


def run_up(env: dict[str, str], store: str, ref: str, tp: int, generate: int) -> dict[str, Any]:
    """``registry up`` under a pty (progress lines) and /usr/bin/time; returns the measurements."""
    timefile = tempfile.NamedTemporaryFile(suffix=".time", delete=False)
    timefile.close()
    argv = ["/usr/bin/time", "-f", "%M", "-o", timefile.name, REGISTRY, "--store", store, "--json", "up", ref]
    argv += ["--tp", str(tp), "--tokens", ",".join(map(str, PROMPT)), "--generate", str(generate)]
    returncode, stdout, events, wall = pty_run(argv, env)
    driver_kib = int(Path(timefile.name).read_text().strip().splitlines()[-1])
    os.unlink(timefile.name)
    if returncode not in (0, 1):
        tail = "\n".join(line for _, line in events[-40:])
        raise RuntimeError(f"registry up --tp {tp}: exit {returncode}\n{stdout[-2000:]}\n{tail}")
    doc = json.loads(stdout)
    prepared = [t for t, line in events if line.endswith("prepare done")]
    timeline = doc["timeline"]
    run_to_first = max(v.get("warm-up", 0.0) + v.get("first token", 0.0) for v in timeline.values())
    ttft = (max(prepared) + run_to_first) if len(prepared) == tp else None
    decode = None
    if doc.get("evidence"):
        shown = registry(env, store, "evidence", ref, "--show", str(doc["evidence"]))
        decode = shown["predicate"].get("decode_seconds")
    rank0_decode = None if decode is None else float(decode["0"])
    return {
        "tp": tp,
        "exit": returncode,
        "passed": doc["passed"],
        "generated": doc["generated"],
        "seconds_to_first_token": ttft,
        "seconds_prepare_done": prepared,
        "seconds_cli_wall": wall,
        "timeline": timeline,
        "ledger": doc["ledger"],
        "memory": doc["memory"],
        "peak_rank_host_bytes": max(int(m.get("host_peak", 0)) for m in doc["memory"].values()),
        "rank_host_resident_after_bytes": max(int(m.get("host_resident", 0)) for m in doc["memory"].values()),
        "driver_peak_rss_bytes": driver_kib * 1024,
        "read_amplification": doc["read_amplification"],
        "decode_seconds": decode,
        "decode_tokens_per_s": None if not rank0_decode else (generate - 1) / rank0_decode,
        "progress": [[round(t, 3), line] for t, line in events if "done" in line],
        "l4": next((r for r in doc.get("parity", []) if r["name"].startswith("logits max")), None),
    }


#: Prepended to the child scripts: a process's own peak RSS (``VmHWM``; ``ru_maxrss`` would carry the
#: parent's peak across fork/exec).
HWM = r"""
def hwm():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM"))
"""


UP_LIB = (
    HWM
    + r"""
import json, resource, sys, time
launch, store, ref = float(sys.argv[1]), sys.argv[2], sys.argv[3]
tp, generate, ladder = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]  # full | sample | off
address = sys.argv[7] or None  # an existing Ray cluster, or None: an embedded head
activations = sys.argv[8]  # float32 | bfloat16
from shardport.registry.session import Session
from shardport.deploy.up import UpRequest, bring_up
events = []
def progress(rank, what):
    events.append([time.time() - launch, rank, what])
request = UpRequest(ref=ref, tokens=(1, 17, 42, 300, 7), steps=generate, tp=tp, store=store, ladder=ladder,
                    address=address, activations=activations)
result = bring_up(Session.open(store), request, store_evidence=False, progress=progress)
doc = result.to_json()
doc["decode_seconds"] = result.predicate.get("decode_seconds")
doc["events"] = events
doc["clock"] = {str(r["rank"]): r.get("clock", {}) for r in result.reports}  # the ranks' wall-clock stamps
doc["seconds_wall"] = time.time() - launch
doc["driver_peak_rss_bytes"] = hwm()
print(json.dumps(doc))
"""
)


def run_up_lib(
    env: dict[str, str],
    store: str,
    ref: str,
    tp: int,
    generate: int,
    ladder: str,
    address: str | None = None,
    activations: str = "float32",
) -> dict[str, Any]:
    """``bring_up`` (the library entry ``registry up`` calls) in a fresh process, with its progress
    callback timestamped from launch: time to first token = last rank's "prepare done" + max over ranks
    of (warm-up + first token)."""
    launch = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            UP_LIB,
            repr(launch),
            store,
            ref,
            str(tp),
            str(generate),
            ladder,
            address or "",
            activations,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bring_up tp {tp}: exit {out.returncode}\n{out.stderr[-3000:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    prepared = [t for t, _, what in doc["events"] if what == "prepare done"]
    timeline = doc["timeline"]
    run_to_first = max(v.get("warm-up", 0.0) + v.get("first token", 0.0) for v in timeline.values())
    decode = doc["decode_seconds"]
    l4 = doc["parity"]
    return {
        "tp": tp,
        "ladder": ladder,
        "address": address,
        "activations": activations,
        "passed": doc["passed"],
        "l4": [
            {k: row[k] for k in ("name", "passed", "value", "tolerance")}
            for row in l4
            if row["level"] == "L4"
        ],
        "generated": doc["generated"],
        "seconds_to_first_token": max(prepared) + run_to_first,
        "seconds_prepare_done": prepared,
        # launch -> the rank's first stage (its imports done; ``clock.resolve``), per rank
        "seconds_to_first_stage": {
            r: c["resolve"] - launch for r, c in sorted(doc["clock"].items()) if "resolve" in c
        },
        "seconds_wall": doc["seconds_wall"],
        "timeline": timeline,
        "memory": doc["memory"],
        "ledger": doc["ledger"],
        "peak_rank_host_bytes": max(int(m.get("host_peak", 0)) for m in doc["memory"].values()),
        "rank_host_resident_after_bytes": max(int(m.get("host_resident", 0)) for m in doc["memory"].values()),
        "driver_peak_rss_bytes": doc["driver_peak_rss_bytes"],
        "decode_seconds": decode,
        "decode_tokens_per_s": (generate - 1) / float(decode["0"]) if decode and decode.get("0") else None,
    }


@contextlib.contextmanager
def existing_cluster(env: dict[str, str], cpus: int) -> Iterator[str]:
    """A Ray head started beforehand (``ray start --head`` on 127.0.0.1), as a user's cluster would be
    running already: ``registry up --address`` then pays no head start-up. Stopped on exit: its own
    processes (those holding files in its temporary folder), never ``ray stop``, which stops every Ray
    cluster on the machine."""
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    temp = tempfile.mkdtemp(prefix="sp-bench-ray-", dir="/tmp")
    argv = [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={cpus}"]
    argv += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        from shardport.deploy.scratch import holders

        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in holders(Path(temp)):
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
            time.sleep(3)
        shutil.rmtree(temp, ignore_errors=True)


# --- (a) the naive per-rank load -------------------------------------------------------------------

NAIVE = (
    HWM
    + r"""
import os, resource, sys, time, json
launch, rank, world = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
path, port = sys.argv[4], sys.argv[5]
import numpy as np, torch, gguf
from gguf.quants import dequantize
torch.set_num_threads(1)
import torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
t_import = time.time() - launch
reader = gguf.GGUFReader(path)
W = {}
COL = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
ROW = ("attn_output", "ffn_down")
t0 = time.time()
for t in reader.tensors:
    full = dequantize(t.data, t.tensor_type)            # the whole tensor, float32
    stem = t.name.split(".")[-2]
    if stem in COL:
        n = full.shape[0] // world
        part = full[rank * n:(rank + 1) * n]
    elif stem in ROW:
        k = full.shape[1] // world
        part = full[:, rank * k:(rank + 1) * k]
    else:
        part = full
    W[t.name] = torch.from_numpy(np.ascontiguousarray(part, dtype=np.float32))
    del full
t_load = time.time() - t0
t1 = time.time()
hidden = W["token_embd.weight"].shape[1]
heads = int(reader.fields["llama.attention.head_count"].parts[-1][0]) // world
kvh = int(reader.fields["llama.attention.head_count_kv"].parts[-1][0]) // world
layers = int(reader.fields["llama.block_count"].parts[-1][0])
hd = hidden // (heads * world)
def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
def rope(x):
    T = x.shape[1]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., ::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)
prompt = torch.tensor([1, 17, 42, 300, 7])
x = W["token_embd.weight"][prompt]
T = x.shape[0]
mask = torch.full((T, T), float("-inf")).triu(1)
with torch.no_grad():
    for i in range(layers):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = (h @ W[p + "attn_q.weight"].T).view(T, heads, hd).transpose(0, 1)
        k = (h @ W[p + "attn_k.weight"].T).view(T, kvh, hd).transpose(0, 1)
        v = (h @ W[p + "attn_v.weight"].T).view(T, kvh, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(heads // kvh, 0)
        v = v.repeat_interleave(heads // kvh, 0)
        a = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v
        o = a.transpose(0, 1).reshape(T, heads * hd) @ W[p + "attn_output.weight"].T
        dist.all_reduce(o)
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])
        m = (torch.nn.functional.silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T))
        d = m @ W[p + "ffn_down.weight"].T
        dist.all_reduce(d)
        x = x + d
    logits = rms(x, W["output_norm.weight"])[-1] @ W["token_embd.weight"].T
    token = int(torch.argmax(logits))
t_first = time.time()
print(json.dumps({"rank": rank, "seconds_import_and_group": t_import, "seconds_read_dequant_narrow": t_load,
    "seconds_forward": t_first - t1, "seconds_to_first_token": t_first - launch, "token": token,
    "peak_rss_bytes": hwm()}))
dist.destroy_process_group()
"""
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_naive(path: Path, world: int) -> dict[str, Any]:
    port = free_port()
    launch = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NAIVE, repr(launch), str(r), str(world), str(path), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    ranks = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"naive rank: exit {p.returncode}\n{err[-3000:]}")
        ranks.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "tp": world,
        "seconds_to_first_token": max(r["seconds_to_first_token"] for r in ranks),
        "seconds_wall": time.time() - launch,
        "peak_rank_host_bytes": max(r["peak_rss_bytes"] for r in ranks),
        "ranks": ranks,
    }


# --- (b) transformers ------------------------------------------------------------------------------

HF = (
    HWM
    + r"""
import sys, time, json, resource
launch = float(sys.argv[1])
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(2)
folder = sys.argv[2]
m = AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf", torch_dtype=torch.float32)
with torch.no_grad():
    logits = m(torch.tensor([[1, 17, 42, 300, 7]])).logits
token = int(logits[0, -1].argmax())
print(json.dumps({"seconds_to_first_token": time.time() - launch, "token": token,
    "peak_rss_bytes": hwm()}))
"""
)


def run_transformers(folder: Path, timeout: float) -> dict[str, Any]:
    try:
        import accelerate  # noqa: F401

        has_accelerate = True
    except ImportError:
        has_accelerate = False
    launch = time.time()
    try:
        out = subprocess.run(
            [sys.executable, "-c", HF, repr(launch), str(folder)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "ran": False,
            "accelerate_installed": has_accelerate,
            "reason": f"timed out after {timeout:g} s",
        }
    if out.returncode != 0:
        last = [line for line in out.stderr.strip().splitlines() if line.strip()][-1:] or ["?"]
        return {
            "ran": False,
            "accelerate_installed": has_accelerate,
            "reason": f"exit {out.returncode}: {last[0][:500]}",
        }
    return {
        "ran": True,
        "accelerate_installed": has_accelerate,
        **json.loads(out.stdout.strip().splitlines()[-1]),
    }


# --- main ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=sorted(SIZES), default="quick")
    ap.add_argument("--generate", type=int, default=8)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--decode-tps", default="1,2", help="extra tp degrees for decode tokens/s")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/results/bringup.json"))
    args = ap.parse_args()
    embed = VOCAB * HIDDEN * 34 // 32
    layers = max(1, round((SIZES[args.size] - embed) / layer_bytes()))
    work = Path(tempfile.mkdtemp(prefix="bench-bringup-"))
    try:
        env = dict(os.environ)
        env["SHARDPORT_HOME"] = str(work / "home")
        env.pop("SHARDPORT_STORE", None)
        store = str(work / "store")
        ref = "bench/llama-q4:prod"
        t = time.perf_counter()
        size = make_gguf(work / "gguf", layers)
        built = time.perf_counter() - t
        print(f"built {size / 2**20:.0f} MiB GGUF ({layers} layers) in {built:.1f} s", file=sys.stderr)
        registry(env, store, "keygen")
        t = time.perf_counter()
        registry(env, store, "push", str(work / "gguf"), ref)
        pushed = time.perf_counter() - t
        print(f"pushed in {pushed:.1f} s", file=sys.stderr)
        cli = run_up(env, store, ref, args.tp, args.generate)
        print(f"registry up --tp {args.tp}: wall {cli['seconds_cli_wall']:.1f}", file=sys.stderr)
        up = run_up_lib(env, store, ref, args.tp, args.generate, ladder="sample")
        print(
            f"bring_up tp {args.tp}: ttft {up['seconds_to_first_token']:.1f}, "
            f"first stage {max(up['seconds_to_first_stage'].values(), default=0):.1f}",
            file=sys.stderr,
        )
        bf16 = run_up_lib(env, store, ref, args.tp, args.generate, ladder="sample", activations="bfloat16")
        print(
            f"bring_up tp {args.tp} --activations bfloat16: ttft {bf16['seconds_to_first_token']:.1f}, "
            f"decode {bf16['decode_tokens_per_s']}",
            file=sys.stderr,
        )
        # the cluster started beforehand: loopback only (FIELD-NOTES), without a token (nothing written
        # under ~/.ray); only its own runs see them (an embedded head refuses RAY_AUTH_MODE=disabled)
        head_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
        with existing_cluster(head_env, max(args.tp, os.cpu_count() or 1)) as address:
            warm = run_up_lib(head_env, store, ref, args.tp, args.generate, ladder="sample", address=address)
        print(
            f"bring_up tp {args.tp} --address: ttft {warm['seconds_to_first_token']:.1f}, "
            f"first stage {max(warm['seconds_to_first_stage'].values(), default=0):.1f}",
            file=sys.stderr,
        )
        no_ladder = run_up_lib(env, store, ref, args.tp, args.generate, ladder="off")
        print(
            f"bring_up tp {args.tp} no ladder: ttft {no_ladder['seconds_to_first_token']:.1f}",
            file=sys.stderr,
        )
        naive = run_naive(work / "gguf" / "model.gguf", args.tp)
        print(f"naive: ttft {naive['seconds_to_first_token']:.1f}", file=sys.stderr)
        hf = (
            {"ran": False, "reason": "--skip-transformers"}
            if args.skip_transformers
            else run_transformers(work / "gguf", timeout=300)
        )
        print(f"transformers: {hf}", file=sys.stderr)
        decode = {str(args.tp): up["decode_tokens_per_s"]}
        decode_bf16 = {str(args.tp): bf16["decode_tokens_per_s"]}
        others = {}
        for tp in [int(x) for x in args.decode_tps.split(",") if x.strip()]:
            others[str(tp)] = run_up_lib(env, store, ref, tp, args.generate, ladder="sample")
            decode[str(tp)] = others[str(tp)]["decode_tokens_per_s"]
            print(f"bring_up tp {tp}: decode {decode[str(tp)]}", file=sys.stderr)
            half = run_up_lib(env, store, ref, tp, args.generate, ladder="sample", activations="bfloat16")
            others[f"{tp}-bfloat16"] = half
            decode_bf16[str(tp)] = half["decode_tokens_per_s"]
            print(f"bring_up tp {tp} bfloat16: decode {decode_bf16[str(tp)]}", file=sys.stderr)
        up_ttft = up["seconds_to_first_token"]
        ratios: dict[str, Any] = {
            "ttft_naive_over_up": naive["seconds_to_first_token"] / up_ttft,
            "ttft_naive_over_up_existing_cluster": naive["seconds_to_first_token"]
            / warm["seconds_to_first_token"],
            "ttft_naive_over_up_without_ladder": naive["seconds_to_first_token"]
            / no_ladder["seconds_to_first_token"],
            "ttft_naive_over_up_bfloat16": naive["seconds_to_first_token"] / bf16["seconds_to_first_token"],
            "ttft_up_over_up_bfloat16": up_ttft / bf16["seconds_to_first_token"],
            "decode_bfloat16_over_float32": (bf16["decode_tokens_per_s"] or 0.0)
            / (up["decode_tokens_per_s"] or float("inf")),
            "ttft_naive_over_up_cli_wall": naive["seconds_to_first_token"] / cli["seconds_cli_wall"],
            "peak_rank_memory_naive_over_up": naive["peak_rank_host_bytes"] / up["peak_rank_host_bytes"],
            "peak_memory_naive_rank_over_up_driver": naive["peak_rank_host_bytes"]
            / up["driver_peak_rss_bytes"],
        }
        if hf.get("ran"):
            ratios["ttft_transformers_over_up"] = hf["seconds_to_first_token"] / up_ttft
            ratios["ttft_transformers_over_up_bfloat16"] = (
                hf["seconds_to_first_token"] / bf16["seconds_to_first_token"]
            )
        goals = {
            "2x_faster_than_naive": ratios["ttft_naive_over_up"] >= 2.0,
            "3x_less_peak_memory_than_naive": ratios["peak_rank_memory_naive_over_up"] >= 3.0,
            "faster_than_transformers": None
            if not hf.get("ran")
            else ratios["ttft_transformers_over_up"] > 1.0,
            "bfloat16_2x_faster_than_naive": ratios["ttft_naive_over_up_bfloat16"] >= 2.0,
            "bfloat16_faster_than_transformers": None
            if not hf.get("ran")
            else ratios["ttft_transformers_over_up_bfloat16"] > 1.0,
        }
        doc = {
            "benchmark": "bringup",
            "size": args.size,
            "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
            "checkpoint": {
                "bytes": size,
                "layers": layers,
                "hidden": HIDDEN,
                "intermediate": INTER,
                "heads": HEADS,
                "kv_heads": KV_HEADS,
                "vocab": VOCAB,
                "types": "Q4_0 q/k/o/gate/up/down, Q8_0 attn_v and tied token_embd, F32 norms",
                "seconds_build": built,
                "seconds_push": pushed,
            },
            "prompt": list(PROMPT),
            "generate": args.generate,
            "registry_up_cli": cli,
            "registry_up": up,
            "registry_up_bfloat16": bf16,
            "registry_up_existing_cluster": warm,
            "registry_up_without_ladder": no_ladder,
            "naive": naive,
            "transformers": hf,
            "registry_up_other_tp": others,
            "decode_tokens_per_s": decode,
            "decode_tokens_per_s_bfloat16": decode_bf16,
            "ratios": ratios,
            "goals": goals,
            "bench_self_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(
            json.dumps(
                {
                    "ratios": ratios,
                    "goals": goals,
                    "decode_tokens_per_s": decode,
                    "decode_bfloat16": decode_bf16,
                },
                indent=2,
            )
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
