"""Multi-node bring-up (issue 28): time to first token at tp 4 on two Ray nodes vs one, in the same run.

    .venv/bin/python bench/bench_multinode.py [--size quick|full] [--generate 2] [--out FILE.json]

Needs root (``ip netns``). The benchmark llama GGUF of ``bench_bringup.py`` (``make_gguf``: ~1 GiB at
``--size full``, ~170 MiB at ``--size quick``) is pushed to a local store under a temp folder (the
namespaces share the file system). Two Ray clusters of two nodes each are started in network
namespaces (``tests/multinode/netns.py``; node A is the head and runs every driver, node B joined over
a veth pair), with the embedded head's object store size (128 MiB) on every node, so that the
object-store handoff is alike in every run. Every run is ``registry up`` as a user would time it: the
CLI as a subprocess inside namespace A with ``--json`` and its stderr on a pseudo-terminal, so its
per-rank "prepare done" progress lines are timestamped here. Time to first token = the last rank's
"prepare done" + max over ranks of (warm-up + first token) from the ranks' timelines.

Cluster 1 (4 CPUs a node: tp 4 fits node A alone, and placement fills the driver's node first):

1. ``single``: ``registry up REF --tp 4`` with the embedded head (no ``--address``), in namespace A: the
   single-node figure, head start-up included (the ranks' ``launch``).
2. ``single_existing``: ``registry up REF --address HEAD --tp 4``: all four ranks on node A (checked), on
   a cluster already running: the like-for-like single-node figure without the head start.

Cluster 2 (2 CPUs a node: four ranks must use both nodes):

3. ``two_nodes_tp4``: ``--address HEAD --tp 4``: two ranks a node, the TP group spans the nodes
   (``placement.tp_spans_nodes`` checked true).
4. ``two_nodes_tp2_pp2``: ``--address HEAD --tp 2 --pp 2``: the preferred placement, TP inside a node
   (``tp_spans_nodes`` checked false).

Per node (``placement.nodes``): ranks, reads (one), bytes fetched and amplification; the bytes fetched
are checked equal, byte for byte, to the node's union computed here from the GGUF's tensor sizes (one
node: the whole checkpoint; tp 4 on two nodes: half of every matrix, the norms whole; tp 2 x pp 2: the
stage's layers, plus the tied embedding on both stages and the output norm on the last). Both "nodes"
share this machine's cores, so the ratio measures the overhead of going multi-node (rendezvous across
the veth, the object-store handoff, gloo over the veth), not scaling.

Writes the JSON document (ratios included) to ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "multinode"))

import netns
from bench_bringup import HIDDEN, PROMPT, REGISTRY, SIZES, VOCAB, layer_bytes, make_gguf, pty_run, registry
from netns import TwoNodeCluster, two_node_cluster

REF = "bench/llama-q4:prod"
GOAL = 1.25  # the bound: two-node TTFT over the single-node TTFT
OBJECT_STORE_BYTES = 128 * 2**20  # what the embedded head gives its node (deploy/cluster.py)
SHARDED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def show_evidence(env: dict[str, str], store: str, digest: str) -> dict[str, Any]:
    """The predicate of the evidence ``digest`` (``registry evidence --show``: exit 1 when it records a
    failed row, its document printed all the same)."""
    argv = [REGISTRY, "--store", store, "--json", "evidence", REF, "--show", digest]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"registry evidence --show {digest}: exit {out.returncode}\n{out.stderr[-3000:]}")
    predicate: dict[str, Any] = json.loads(out.stdout)["predicate"]
    return predicate


def run_up_in_head(
    cluster: TwoNodeCluster, env: dict[str, str], store: str, args: list[str], generate: int
) -> dict[str, Any]:
    """``registry up REF ARGS`` inside namespace A under ``/usr/bin/time``; the measurements.

    The CLI prints its per-rank progress lines only in its human form with stderr on a terminal (not
    under ``--json``), so it runs in that form; the document (timeline, memory, placement) is then read
    from the signed evidence it stored (``registry evidence REF --show ID``).
    """
    timefile = tempfile.NamedTemporaryFile(suffix=".time", delete=False)
    timefile.close()
    argv = ["ip", "netns", "exec", cluster.a.netns, "/usr/bin/time", "-f", "%M", "-o", timefile.name]
    argv += [REGISTRY, "--store", store, "up", REF, *args]
    argv += ["--tokens", ",".join(map(str, PROMPT)), "--generate", str(generate)]
    code, stdout, events, wall = pty_run(argv, cluster.driver_env(env), timeout=900)
    driver_kib = int(Path(timefile.name).read_text().strip().splitlines()[-1] or 0)
    os.unlink(timefile.name)
    evidence = [line.split()[1] for line in stdout.splitlines() if line.strip().startswith("evidence ")]
    if code not in (0, 1) or not evidence:
        tail = "\n".join(line for _, line in events[-40:])
        raise RuntimeError(f"registry up {' '.join(args)}: exit {code}\n{stdout[-2000:]}\n{tail}")
    doc = show_evidence({**os.environ, **env}, store, evidence[0])
    timeline = doc["timeline"]
    prepared = [t for t, line in events if line.endswith("prepare done")]
    run_to_first = max(v.get("warm-up", 0.0) + v.get("first token", 0.0) for v in timeline.values())
    ttft = (max(prepared) + run_to_first) if len(prepared) == len(timeline) else None
    return {
        "args": args,
        "exit": code,
        "passed": doc["passed"],
        "failed_rows": [r["name"] for r in doc.get("parity", []) if r.get("passed") is False],
        "generated": doc["generated"],
        "seconds_to_first_token": ttft,
        "seconds_prepare_done": prepared,
        "seconds_cli_wall": wall,
        "seconds_launch_max": max(v.get("launch", 0.0) for v in timeline.values()),
        "timeline": timeline,
        "placement": doc["placement"],
        "memory": {
            r: {k: m.get(k) for k in ("bytes_fetched", "host_peak")} for r, m in doc["memory"].items()
        },
        "driver_peak_rss_bytes": driver_kib * 1024,
        "progress": [[round(t, 3), line] for t, line in events if "done" in line or "started" in line],
    }


def gguf_sizes(path: Path) -> dict[str, int]:
    """Each tensor's bytes in the GGUF, by name."""
    import gguf

    return {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}


def expected_unions(sizes: dict[str, int], run: dict[str, Any], layers: int) -> list[int]:
    """Each node's union, in the order of ``placement.nodes``, from the GGUF's tensor sizes.

    One node: every tensor. tp 4 on two nodes: half of every matrix (the linears and the tied
    embedding are split four ways, a node holds two quarters), the norms whole. tp 2 x pp 2: the node of
    stage 0 holds the embedding and its layers, the node of stage 1 its layers, the output norm and the
    tied embedding again (the output head); the stage's layer count is the one that makes the node's
    bytes whole layers (none where no count does), and the two counts must add up to ``layers``.
    """
    nodes = run["placement"]["nodes"]
    total = sum(sizes.values())
    if len(nodes) == 1:
        return [total]
    topo = run["args"]
    if "--pp" not in topo:  # tp 4, two ranks a node
        norms = sum(v for k, v in sizes.items() if k.endswith("norm.weight"))
        return [(total - norms) // 2 + norms] * 2
    embed, out_norm = sizes["token_embd.weight"], sizes["output_norm.weight"]
    per_layer = sum(v for k, v in sizes.items() if k.startswith("blk.0."))
    fixed = [embed, embed + out_norm]
    counts = [round((int(n["bytes_fetched"]) - f) / per_layer) for n, f in zip(nodes, fixed, strict=True)]
    if sum(counts) != layers:
        counts = [0, 0]  # no split of the layers explains the reads: every check fails
    return [f + c * per_layer for f, c in zip(fixed, counts, strict=True)]


def node_checks(run: dict[str, Any], unions: list[int]) -> list[dict[str, Any]]:
    """Per node: one read, and bytes fetched equal to the node's union from the GGUF (exactly)."""
    rows = []
    for n, union in zip(run["placement"]["nodes"], unions, strict=True):
        fetched = int(n["bytes_fetched"])
        rows.append(
            {
                "address": n["address"],
                "ranks": n["ranks"],
                "reads": n["reads"],
                "bytes_assigned_sum_of_ranks": int(n["bytes_assigned"]),
                "bytes_fetched": fetched,
                "read_amplification": n["read_amplification"],
                "bytes_union_from_gguf": union,
                "fetched_minus_union": fetched - union,
                "passed": n["reads"] == 1 and fetched == union,
            }
        )
    return rows


def _say(name: str, run: dict[str, Any]) -> None:
    ttft = run["seconds_to_first_token"]
    print(
        f"{name}: ttft {ttft if ttft is None else round(ttft, 1)} s, wall {run['seconds_cli_wall']:.1f} s, "
        f"launch {run['seconds_launch_max']:.1f} s, nodes "
        f"{[(n['ranks'], n['reads'], n['bytes_fetched']) for n in run['placement']['nodes']]}",
        file=sys.stderr,
    )


def measure(
    work: Path, env: dict[str, str], store: str, generate: int, sizes: dict[str, int], layers: int
) -> dict[str, Any]:
    netns.OBJECT_STORE_BYTES = OBJECT_STORE_BYTES  # read by _ray_start at each ray start
    runs: dict[str, Any] = {}
    t = time.perf_counter()
    with two_node_cluster(work / "c4", cpus_per_node=4) as cluster:
        runs["seconds_cluster_start_4cpu"] = time.perf_counter() - t
        runs["single"] = run_up_in_head(cluster, env, store, ["--tp", "4"], generate)
        _say("single (embedded head)", runs["single"])
        head = ["--address", cluster.head_address]
        runs["single_existing"] = run_up_in_head(cluster, env, store, [*head, "--tp", "4"], generate)
        _say("single (existing cluster, node A)", runs["single_existing"])
        runs["single_existing"]["on_node_a_only"] = [
            n["address"] for n in runs["single_existing"]["placement"]["nodes"]
        ] == [cluster.a.address]
    t = time.perf_counter()
    with two_node_cluster(work / "c2", cpus_per_node=2) as cluster:
        runs["seconds_cluster_start_2cpu"] = time.perf_counter() - t
        head = ["--address", cluster.head_address]
        runs["two_nodes_tp4"] = run_up_in_head(cluster, env, store, [*head, "--tp", "4"], generate)
        _say("two nodes tp 4", runs["two_nodes_tp4"])
        runs["two_nodes_tp2_pp2"] = run_up_in_head(
            cluster, env, store, [*head, "--tp", "2", "--pp", "2"], generate
        )
        _say("two nodes tp 2 x pp 2", runs["two_nodes_tp2_pp2"])
        for name in ("two_nodes_tp4", "two_nodes_tp2_pp2"):
            runs[name]["on_both_nodes"] = sorted(
                n["address"] for n in runs[name]["placement"]["nodes"]
            ) == sorted([cluster.a.address, cluster.b.address])
    for name in ("single", "single_existing", "two_nodes_tp4", "two_nodes_tp2_pp2"):
        runs[name]["nodes_checked"] = node_checks(runs[name], expected_unions(sizes, runs[name], layers))
    return runs


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def summarize(runs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ttft = {k: runs[k]["seconds_to_first_token"] for k in ("single", "single_existing", "two_nodes_tp4",
                                                          "two_nodes_tp2_pp2")}  # fmt: skip
    ratios = {
        "ttft_two_nodes_tp4_over_single": _ratio(ttft["two_nodes_tp4"], ttft["single"]),
        "ttft_two_nodes_tp2_pp2_over_single": _ratio(ttft["two_nodes_tp2_pp2"], ttft["single"]),
        "ttft_two_nodes_tp4_over_single_existing": _ratio(ttft["two_nodes_tp4"], ttft["single_existing"]),
        "ttft_two_nodes_tp2_pp2_over_single_existing": _ratio(
            ttft["two_nodes_tp2_pp2"], ttft["single_existing"]
        ),
    }
    tp4, pp = runs["two_nodes_tp4"], runs["two_nodes_tp2_pp2"]
    goals = {
        f"tp4_two_nodes_within_{GOAL}x_single": None
        if ratios["ttft_two_nodes_tp4_over_single"] is None
        else ratios["ttft_two_nodes_tp4_over_single"] <= GOAL,
        f"tp4_two_nodes_within_{GOAL}x_single_existing": None
        if ratios["ttft_two_nodes_tp4_over_single_existing"] is None
        else ratios["ttft_two_nodes_tp4_over_single_existing"] <= GOAL,
        "tp4_fetched_per_node_equals_union": all(r["passed"] for r in tp4["nodes_checked"]),
        "tp2_pp2_fetched_per_node_equals_union": all(r["passed"] for r in pp["nodes_checked"]),
        "single_fetched_equals_checkpoint": all(
            r["passed"] for k in ("single", "single_existing") for r in runs[k]["nodes_checked"]
        ),
        "tp4_spans_nodes": tp4["placement"].get("tp_spans_nodes") is True and tp4["on_both_nodes"],
        "tp2_pp2_tp_inside_nodes": pp["placement"].get("tp_spans_nodes") is False and pp["on_both_nodes"],
        "single_existing_on_node_a_only": runs["single_existing"]["on_node_a_only"],
        "all_passed_and_same_tokens": all(runs[k]["passed"] for k in ttft)
        and len({json.dumps(runs[k]["generated"]) for k in ttft}) == 1,
    }
    return ratios, goals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--generate", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench/results/multinode.json"))
    args = ap.parse_args()
    embed = VOCAB * HIDDEN * 34 // 32
    layers = max(1, round((SIZES[args.size] - embed) / layer_bytes()))
    work = Path(tempfile.mkdtemp(prefix="bench-multinode-"))
    os.chmod(work, 0o755)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["SHARDPORT_HOME"] = str(work / "home")
        env.pop("SHARDPORT_STORE", None)
        store = str(work / "store")
        t = time.perf_counter()
        size = make_gguf(work / "gguf", layers)
        built = time.perf_counter() - t
        print(f"built {size / 2**20:.0f} MiB GGUF ({layers} layers) in {built:.1f} s", file=sys.stderr)
        registry(env, store, "keygen")
        t = time.perf_counter()
        registry(env, store, "push", str(work / "gguf"), REF)
        pushed = time.perf_counter() - t
        sizes = gguf_sizes(work / "gguf" / "model.gguf")
        home = {"SHARDPORT_HOME": env["SHARDPORT_HOME"]}
        runs = measure(work, home, store, args.generate, sizes, layers)
        ratios, goals = summarize(runs)
        doc = {
            "benchmark": "multinode",
            "size": args.size,
            "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
            "note": "both namespaced nodes share this machine's cores: the ratios measure the overhead of "
            "two nodes (rendezvous, object-store handoff, gloo over a veth), not scaling",
            "checkpoint": {"bytes": size, "layers": layers, "seconds_build": built, "seconds_push": pushed},
            "object_store_bytes_per_node": OBJECT_STORE_BYTES,
            "prompt": list(PROMPT),
            "generate": args.generate,
            "runs": runs,
            "ratios": ratios,
            "goals": goals,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(doc, indent=2))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
