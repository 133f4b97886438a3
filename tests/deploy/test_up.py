"""``registry up``: quantized llama checkpoints brought up on Ray ranks, parity L0-L5, signed evidence,
failures that abort cleanly (tampered tile, forbidden fallback, a killed rank) and rollback by tag."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bringup_artifacts import INTER, VOCAB, add_tokenizer_json, gguf_tiny, gptq_mixtral, gptq_tiny
from llama_artifacts import ok
from safetensors.numpy import load_file

from shardport.cli import main
from shardport.deploy.contract import check_inventory, contract_of
from shardport.deploy.errors import RankFailedError, RankLostError, UnsupportedModelError
from shardport.deploy.rank import RankSpec
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up, ray_launcher, specs_for
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.errors import UsageError
from shardport.registry.evidence import read_evidence
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key
from shardport.registry.store.s3 import S3_PROFILE
from shardport.registry.trust.resolve import resolve

PROMPT = (1, 5, 300, 7, 396)


def _push(home: Path, tmp: Path, folder: Path, ref: str, *options: str) -> str:
    store = str(tmp / "store")
    if not (home / "keys").exists():
        ok(store, "keygen")
    ok(store, "push", folder, ref, *options)
    return store


def _cli(store: str, *args: str) -> tuple[int, dict[str, Any]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["--store", store, "--json", *args])
    return code, json.loads(buf.getvalue())


#: Rows a CPU bring-up may leave ``not applicable``: no device memory; a tp > 1 slice no pin covers;
#: kernels that run the stored codes in place compare none.
NOT_APPLICABLE_HERE = {
    "device memory within the ledger",
    "expected kernel on every weight of every rank",
    "codes preserved by every layout",
    "E_quant vs float reference (push --reference)",  # pushed without --reference
}


def _all_pass(parity: list[dict[str, Any]]) -> None:
    failed = [row for row in parity if row["status"] == "fail" or row["passed"] is False]
    assert not failed, failed
    idle = {row["name"] for row in parity if row["status"] != "pass"}  # each says why in its detail
    assert idle <= NOT_APPLICABLE_HERE, [row for row in parity if row["name"] in idle - NOT_APPLICABLE_HERE]
    assert {row["level"] for row in parity} == {"L0", "L1", "L2", "L3", "L4", "L5"}


@pytest.mark.ray
@pytest.mark.slow
def test_gptq_up_at_tp2_proves_parity_and_stores_evidence(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    # pushed preferring int4pack, so the GPTQ linears are repacked even in this float32 run (by default
    # float32 runs them as loaded on cpu.int4-direct: int4pack's float32 path is scalar; see test_up_matrix)
    packed = ("--kernels-preferred", "cpu.int4pack")
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1", *packed)
    report, logits = tmp_path / "up.html", tmp_path / "logits.safetensors"
    tokens = ",".join(map(str, PROMPT))
    code, doc = _cli(
        store, "up", "llama/gptq:v1", "--tp", "2", "--tokens", tokens, "--generate", "4",
        "--report", str(report), "--logits-out", str(logits),
    )  # fmt: skip
    assert code == 0, doc
    _all_pass(doc["parity"])
    assert len(doc["generated"]) == 4 and set(doc["read_amplification"]) == {"0", "1"}
    # both ranks on this one node: one read of their union, by rank 0, handed to rank 1
    [node] = doc["placement"]["nodes"]
    mem = doc["memory"]
    assert node["ranks"] == [0, 1] and node["reads"] == 1
    assert node["bytes_fetched"] == mem["0"]["bytes_fetched"] > 0 == mem["1"]["bytes_fetched"]
    assert node["bytes_assigned"] == mem["0"]["bytes_assigned"] + mem["1"]["bytes_assigned"]
    assert set(doc["timeline"]["1"]) >= {
        "resolve",
        "plan",
        "fetch",
        "verify",
        "repack",
        "warm-up",
        "first token",
    }
    assert doc["memory"]["0"]["codes_and_qparams"] > 0 and doc["ledger"]["1"]["kv_cache"] > 0
    # every GPTQ linear repacked: its loaded planes released, none kept unused
    assert all(m["codes_released"] > 0 for m in doc["memory"].values())
    assert all(c["codes_retained_unused"] == 0 for c in doc["ledger"].values())
    written = load_file(str(logits))["logits"]
    assert written.dtype == np.float32 and written.shape == (len(PROMPT), VOCAB)
    assert int(written[-1].argmax()) == doc["generated"][0]
    page = report.read_text()
    assert "evidence-data" in page and doc["digest"] in page
    assert "No per-operator L3 records" not in page  # the CLI hands the ladder values to the L3 chart
    assert "Only the maxima are in this evidence" not in page  # L4 |Δ| per position and decode step
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    assert browser is not None, "no headless Chromium: scripts/test.sh installs chromium-headless-shell"
    flags = ["--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--dump-dom"]
    dom = subprocess.run([browser, *flags, report.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-charts="drawn"' in dom.stdout
    assert len(re.findall(r'<rect[^>]*class="mark"', dom.stdout)) >= 2 * 7  # 2 ranks x stages, + memory
    assert [line for line in dom.stderr.splitlines() if "CONSOLE" in line] == []
    verified = ok(store, "verify", "llama/gptq:v1")
    assert verified["evidence_verified"] >= 1
    listed = ok(store, "evidence", "llama/gptq:v1")
    assert [e["topology"] for e in listed["evidence"]] == [{"tp": 2, "ep": 1, "pp": 1}]


@pytest.mark.ray
@pytest.mark.slow
def test_gguf_mix_with_tied_q8_embedding_up_at_tp3(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push(home, tmp_path, gguf_tiny(tmp_path / "gguf"), "llama/gguf:v1")
    session = Session.open(store)
    request = UpRequest(ref="llama/gguf:v1", tokens=PROMPT, steps=3, tp=3, store=store)  # --fallback warn
    result = bring_up(session, request, launcher=ray_launcher(None))
    _all_pass(result.predicate["parity"])
    kernels = {row["weight"].split("[")[0]: row["kernel"] for row in result.predicate["dispatch"]}
    assert (
        kernels["blk.0.attn_q.weight"] == kernels["blk.0.attn_output.weight"] == "cpu.gguf-direct@1"
    )  # Q4_0, Q4_1: float32 is int4pack's slow path, so the direct kernel runs them in place (bfloat16:
    # int4pack, test_bfloat16_activations_up_at_tp2_on_a_q4_0_q8_0_gguf)
    assert {r["transformation"] for r in result.predicate["dispatch"]} == {"none"}  # nothing repacked
    assert {r["path"] for r in result.predicate["dispatch"]} == {"fast"}
    assert kernels["blk.0.ffn_up.weight"] == kernels["token_embd.weight"] == "cpu.gguf-direct@1"  # Q8_0
    assert (
        kernels["blk.0.ffn_down.weight"] == kernels["blk.1.ffn_down.weight"] == "cpu.gguf-direct@1"
    )  # Q4_K, Q6_K
    assert result.predicate["l5"]["fallbacks"].get("full-dequant", 0) == 0
    weights = {(r["rank"], r["weight"].split("[")[0]) for r in result.predicate["dispatch"]}
    assert (2, "token_embd.weight") in weights  # the tied Q8_0 embedding is every rank's head
    down = [r for r in result.predicate["dispatch"] if r["weight"].startswith("blk.0.ffn_down")]
    assert [r["weight"] for r in down if r["phase"] == "decode"] == [
        f"blk.0.ffn_down.weight[N=0:192, K={a}:{b}]" for a, b in ((0, 256), (256, 512), (512, INTER))
    ]  # the Q4_K weight split along K on superblock boundaries
    evidence = read_evidence(session, "llama/gguf", result.digest)
    assert len(evidence.verified) == 1 and evidence.verified[0].predicate["passed"]


#: A GGUF of Q4_0 (int4pack) and Q8_0 (gguf-direct) linears with a tied Q8_0 embedding, and a prompt
#: whose float32 logits are far enough apart for bfloat16: the top-1 margins at every prompt and decode
#: position are >= 0.04, ~4x the bfloat16 run's max |Δ| (~0.01); other seeds and prompts of these tiny
#: random models have margins of 0.0005, which bfloat16's ~1 % of the logit scale can flip.
Q4_Q8 = {
    "attn_q": "Q4_0",
    "attn_k": "Q4_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_0",
    "ffn_gate": "Q4_0",
    "ffn_up": "Q8_0",
    "ffn_down": "Q4_0",
}
BF16_SEED, BF16_PROMPT = 7, (1, 17, 42)


@pytest.mark.ray
@pytest.mark.slow
def test_bfloat16_activations_up_at_tp2_on_a_q4_0_q8_0_gguf(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    folder = gguf_tiny(tmp_path / "gguf", seed=BF16_SEED, types=Q4_Q8)
    store = _push(home, tmp_path, folder, "llama/q4q8:v1")
    logits = tmp_path / "logits.safetensors"
    tokens = ",".join(map(str, BF16_PROMPT))
    code, doc = _cli(
        store, "up", "llama/q4q8:v1", "--tp", "2", "--tokens", tokens, "--generate", "3",
        "--activations", "bfloat16", "--logits-out", str(logits), "--no-evidence",
    )  # fmt: skip
    assert code == 0, doc
    _all_pass(doc["parity"])  # L4 top-1 and greedy tokens identical to the float32 reference, L5 as usual
    rows = {(r["rank"], r["weight"].split("[")[0], r["phase"]): r for r in doc["dispatch"]}
    int4 = [r for r in rows.values() if r["kernel"] == "cpu.int4pack@1"]
    assert len(int4) == 2 * 2 * 2 * 5  # ranks x phases x layers x the Q4_0 slots
    assert all(r["activations"] == "bfloat16" for r in int4)
    assert rows[(1, "blk.0.ffn_up.weight", "decode")]["activations"] == "bfloat16"  # Q8_0: gguf-direct
    assert {
        rows[(rank, "token_embd.weight", p)]["activations"] for rank in (0, 1) for p in ("prefill", "decode")
    } == {"float32"}  # the tied head keeps float32 logits, and its trace says so
    runtime = doc["runtime"]
    assert runtime["activations"] == "bfloat16" and runtime["operators"]["float32"] == 4
    assert len(runtime["float32"]) == 2 and all("output head keeps float32" in x for x in runtime["float32"])
    l4 = next(r for r in doc["parity"] if r["name"].startswith("logits max"))
    scale = float(np.abs(load_file(str(logits))["logits"]).max())
    assert 2 * l4["value"] < l4["tolerance"] < 0.15 * max(1.0, scale)  # bf16-sized, not vacuous
    assert 1e-3 < l4["value"]  # the operators did run bfloat16 (float32 differs by ~1e-6)
    cache = next(r for r in doc["parity"] if r["name"].startswith("KV cache"))
    assert cache["tolerance"] > 1e-3  # derived from bfloat16's rounding


@pytest.mark.ray
@pytest.mark.slow
def test_two_pipeline_stages(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    request = UpRequest(ref="llama/gptq:v1", tokens=PROMPT, steps=3, pp=2, store=store, ladder=False)
    result = bring_up(Session.open(store), request, launcher=ray_launcher(None))
    late = [row for row in result.predicate["parity"] if row["level"] in ("L4", "L5")]
    assert len(late) == 11 and not [r for r in late if r["status"] == "fail"], late  # 4 L4 rows, 7 L5
    assert {r["name"] for r in late if r["status"] != "pass"} <= NOT_APPLICABLE_HERE, late
    layers = {(row["rank"], row["weight"].split(".")[2]) for row in result.predicate["dispatch"]}
    assert layers == {(0, "0"), (1, "1")}  # stage 0 runs layer 0, stage 1 layer 1 (and the float head)
    assert result.generated == tuple(result.predicate["parity_l4"]["reference_tokens"])
    # the L4 reference is transformers' own LlamaDecoderLayer (the test install has it), and L4 says so
    assert result.predicate["parity_l4"]["reference"]["class"] == "LlamaDecoderLayer"
    assert "reference: transformers" in next(r for r in late if r["name"].startswith("logits max"))["detail"]


@pytest.mark.ray
@pytest.mark.slow
def test_mixture_of_experts_over_two_expert_parallel_ranks(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    store = _push(home, tmp_path, gptq_mixtral(tmp_path / "moe"), "llama/moe:v1")
    request = UpRequest(ref="llama/moe:v1", tokens=PROMPT, steps=3, ep=2, store=store)
    result = bring_up(Session.open(store), request, launcher=ray_launcher(None))
    _all_pass(result.predicate["parity"])
    experts: dict[int, set[str]] = {0: set(), 1: set()}
    for row in result.predicate["dispatch"]:
        if ".experts." in row["weight"]:
            experts[row["rank"]].add(row["weight"].split(".experts.")[1].split(".")[0])
    assert experts == {0: {"0", "1"}, 1: {"2", "3"}}  # each ep rank prepared only its own experts


@pytest.mark.ray
@pytest.mark.s3
@pytest.mark.slow
def test_up_from_seaweedfs_s3(home: Path, tmp_path: Path, seaweed_store_url: str, ray_ranks: Any) -> None:
    ok(seaweed_store_url, "keygen")
    ok(seaweed_store_url, "push", gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    code, doc = _cli(
        seaweed_store_url, "up", "llama/gptq:v1", "--tp", "2", "--tokens", "1,2,3", "--generate", "2"
    )
    assert code == 0, doc
    _all_pass(doc["parity"])
    # a rank's N-split of every GPTQ [K/8, N] row is read whole on S3 (requests priced), gaps and all
    bound = S3_PROFILE.max_amplification + 0.02
    # both ranks share their node's one read: below 1.0 where they need the same tiles (norms, embeddings)
    assert all(0.5 <= float(a) <= bound for a in doc["read_amplification"].values()), doc[
        "read_amplification"
    ]
    [node] = doc["placement"]["nodes"]
    assert node["reads"] == 1 and node["ranks"] == [0, 1] and node["read_amplification"] <= bound
    assert ok(seaweed_store_url, "verify", "llama/gptq:v1")["evidence_verified"] == 1


@pytest.mark.ray
@pytest.mark.slow
def test_a_tampered_tile_aborts_naming_rank_tensor_and_tile(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    store = _push(home, tmp_path, gguf_tiny(tmp_path / "gguf"), "llama/gguf:v1")
    session = Session.open(store)
    manifest = resolve(session, parse_ref("llama/gguf:v1")).manifest
    entry = next(t for t in manifest.tensors or [] if t.name == "blk.1.ffn_up.weight")
    blob = next(f.digest for f in manifest.files if f.path == entry.file)
    row_bytes = (entry.end - entry.start) // entry.shape[0]
    data = bytearray(session.store.read(blob_key(blob)))
    data[entry.start + row_bytes * (INTER - 10) + 5] ^= 0x10  # a row only tp rank 1 holds
    session.store.put(blob_key(blob), bytes(data))
    request = UpRequest(ref="llama/gguf:v1", tokens=PROMPT, tp=2, fallback="allow", store=store)
    with pytest.raises(RankFailedError) as caught:
        bring_up(session, request, launcher=ray_launcher(None))
    message = str(caught.value)
    # both ranks on one node: rank 0 reads their union once, and the tile (rank 1's) fails that read
    assert caught.value.rank == 0 and caught.value.kind == "TileDigestMismatchError"
    assert "for ranks [0, 1]" in message and "blk.1.ffn_up.weight" in message and "tile" in message
    assert caught.value.exit_code == 1


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_rank_fails_cleanly_and_leaks_nothing(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    from shardport.deploy.cluster import connect
    from shardport.deploy.ray_ranks import RayRanks

    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    pinned = f"llama/gptq@{resolve(Session.open(store), parse_ref('llama/gptq:v1')).digest}"
    request = UpRequest(ref=pinned, tokens=PROMPT, tp=2, store=store, ladder=False)
    with connect(None, world=2) as cluster, RayRanks(cluster, 2) as ranks:
        ranks.prepare(specs_for(request, pinned, 2.0))
        ray_ranks.kill(ranks.actors[1], no_restart=True)
        with pytest.raises(RankLostError, match=r"rank 1: its actor died"):
            ranks.run()
    # the ray_ranks fixture asserts no actor and no placement group is left


def test_bfloat16_activations_beside_float16_embeddings_and_head(home: Path, tmp_path: Path) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    request = UpRequest(
        ref="llama/gptq:v1", tokens=(7, 8, 9, 10), steps=3, store=store, ladder="full", activations="bfloat16"
    )  # a prompt whose top-1 margins (>= 0.38) are ~7x the bfloat16 run's max |Δ| (~0.057)
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    _all_pass(result.predicate["parity"])  # the full ladder L0-L3 in bfloat16 on every operator, L4, L5
    traces = result.reports[0]["dispatch"]
    assert len(traces) == 2 * 2 * 7 and all(t["requested"]["activation_dtype"] == "bfloat16" for t in traces)
    assert {t["selected"] for t in traces} == {"cpu.int4pack@1"}  # the float16 embedding and head: floats
    assert result.predicate["runtime"] == {
        "activations": "bfloat16",
        "ranks": {"0": "bfloat16"},
        "operators": {"bfloat16": 28},
        "float32": [],
    }
    assert result.predicate["parity_l4"]["tolerance_derivation"]["activations"] == "bfloat16"


def test_required_kernels_are_what_l5_expects(home: Path, tmp_path: Path) -> None:
    """Pushed with --kernels-required cpu.int4pack: float32 runs it on int4pack's slow path (the faster
    direct kernel is not allowed), and L5 expects exactly that (it once expected the direct kernel)."""
    store = _push(
        home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:req", "--kernels-required", "cpu.int4pack"
    )
    request = UpRequest(ref="llama/gptq:req", tokens=(1, 5, 300, 7), steps=2, store=store, ladder="off")
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    assert {t["selected"] for t in result.reports[0]["dispatch"]} == {"cpu.int4pack@1"}
    assert result.predicate["passed"] and not result.predicate["l5"]["unexpected_kernels"]
    assert {row["path"] for row in result.predicate["dispatch"]} == {"slow"}


def test_activations_flag_refuses_an_unknown_dtype(home: Path, tmp_path: Path) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    code, doc = _cli(store, "up", "llama/gptq:v1", "--tokens", "1,2", "--activations", "float16")
    assert code == 2, doc
    message = doc["error"]["message"]
    assert "--activations" in message and "float16" in message
    assert "float32" in message and "bfloat16" in message  # the choices
    request = UpRequest(ref="llama/gptq:v1", tokens=(1, 2), store=store, activations="fp8")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"--activations 'fp8': expected one of auto, float32, bfloat16"):
        bring_up(Session.open(store), request, launcher=run_in_process)


def test_forbid_refuses_listing_every_candidates_reason(home: Path, tmp_path: Path) -> None:
    """Pushed by the library without the runtime layer: the driver's slice admission refuses before any
    read, and on a joined cluster (devices unknown to the driver) the rank's dispatch; both with every
    candidate's reason."""
    from shardport.deploy.errors import UnsupportedModelError
    from shardport.kernels import default_catalog
    from shardport.registry.push import push

    store = str(tmp_path / "store")
    ok(store, "keygen")
    push(Session.open(store), gptq_tiny(tmp_path / "gptq2", bits=2), "llama/gptq2", "v1")
    request = UpRequest(ref="llama/gptq2:v1", tokens=PROMPT, fallback="forbid", store=store)
    with pytest.raises(UnsupportedModelError) as admitted:
        bring_up(Session.open(store), request, launcher=run_in_process)
    joined = UpRequest(**{**request.__dict__, "address": "127.0.0.1:6379"})  # the launcher is in-process
    with pytest.raises(RankFailedError) as caught:
        bring_up(Session.open(store), joined, launcher=run_in_process)
    assert caught.value.stage == "repack" and "Forbidden" in caught.value.kind
    for message in (str(admitted.value), str(caught.value)):
        assert "model.layers.0.mlp.down_proj.weight" in message  # 2-bit codes: no kernel here takes them
        for kernel in default_catalog():  # every candidate's reason, the policy's refusals included
            assert kernel.capability.id in message, kernel.capability.id
        assert "policy" in message


def test_allow_runs_codes_no_kernel_reads_and_l1_says_not_applicable(home: Path, tmp_path: Path) -> None:
    """2-bit codes under --fallback allow: every operator on a dense copy or the reference decoder, so no
    code is read back anywhere: the L1 row is "not applicable" with the reason (not a pass over 0 codes)
    and the bring-up still passes on the levels that measured something."""
    from shardport.registry.push import push

    store = str(tmp_path / "store")
    ok(store, "keygen")
    push(Session.open(store), gptq_tiny(tmp_path / "gptq2", bits=2), "llama/gptq2", "v1")
    request = UpRequest(
        ref="llama/gptq2:v1", tokens=PROMPT, steps=2, fallback="allow", store=store, ladder="full"
    )
    result = bring_up(Session.open(store), request, launcher=run_in_process, store_evidence=False)
    rows = {row["level"]: row for row in reversed(result.predicate["parity"])}  # each level's first row
    l1 = rows["L1"]
    assert l1["status"] == "not applicable" and l1["passed"] is None, l1
    assert "dense float copy" in l1["detail"] or "reference decoder itself" in l1["detail"]
    assert all(rows[level]["passed"] for level in ("L0", "L2", "L3", "L4"))
    assert result.predicate["passed"]


def test_a_model_no_kernel_admits_is_refused_before_anything_starts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pushed by the CLI, the manifest pins no kernel for 2-bit codes on the CPU: refused at once."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU ranks, whatever this host has
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq2", bits=2), "llama/gptq2:v1")
    launched: list[int] = []

    def never(specs: Sequence[RankSpec]) -> list[dict[str, Any]]:
        launched.append(len(specs))
        return run_in_process(specs)

    for fallback in ("forbid", "warn"):
        request = UpRequest(ref="llama/gptq2:v1", tokens=PROMPT, fallback=fallback, store=store)  # type: ignore[arg-type]
        refused = r"no kernel of this shardport admits .* on cpu/float32"
        with pytest.raises(UnsupportedModelError, match=refused):
            bring_up(Session.open(store), request, launcher=never)
    assert launched == []


def test_rollback_then_up_brings_up_the_older_pinned_manifest(home: Path, tmp_path: Path) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "v1", seed=5), "llama/q:prod")
    session = Session.open(store)
    up = UpRequest(ref="llama/q:prod", tokens=PROMPT, steps=2, store=store, ladder=False)
    first = bring_up(session, up, launcher=run_in_process)
    ok(store, "push", gptq_tiny(tmp_path / "v2", seed=6), "llama/q:prod")
    second = bring_up(session, up, launcher=run_in_process)
    assert second.digest != first.digest and second.predicate["tag"]["version"] == 2
    ok(store, "rollback", "llama/q:prod", "--steps", "1", "--reason", "v2 regressed")
    third = bring_up(session, up, launcher=run_in_process)
    assert third.digest == first.digest
    tag = third.predicate["tag"]
    assert tag["version"] == 3 and tag["rollback_of"] == 2 and tag["digest"] == first.digest
    stored = read_evidence(session, "llama/q", first.digest).verified
    assert [e.predicate["tag"]["version"] for e in stored] == [1, 3]
    pinned = bring_up(
        session, UpRequest(**{**up.__dict__, "ref": f"llama/q@{second.digest}"}), launcher=run_in_process
    )
    assert pinned.digest == second.digest and pinned.predicate["tag"] is None


def test_an_inventory_that_does_not_match_the_architecture_is_refused(home: Path, tmp_path: Path) -> None:
    store = _push(home, tmp_path, gptq_tiny(tmp_path / "gptq"), "llama/gptq:v1")
    manifest = resolve(Session.open(store), parse_ref("llama/gptq:v1")).manifest
    contract = contract_of(manifest)
    check_inventory(contract, manifest)
    fewer = manifest.model_copy(
        update={"weights": [w for w in manifest.weights or [] if "layers.1.mlp.up" not in w.name]}
    )
    with pytest.raises(UnsupportedModelError, match=r"missing \['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        check_inventory(contract, fewer)
    with pytest.raises(UnsupportedModelError, match="not read by"):
        check_inventory(contract.model_copy(update={"layers": 1}), manifest)


def test_prompt_text_uses_the_checkpoints_verified_tokenizer(home: Path, tmp_path: Path) -> None:
    from shardport.deploy.tokenizer import load_tokenizer, read_tokenizer

    store = _push(home, tmp_path, add_tokenizer_json(gptq_tiny(tmp_path / "gptq")), "llama/gptq:v1")
    session = Session.open(store)
    request = UpRequest(
        ref="llama/gptq:v1", tokens=(), prompt="hello world", steps=2, store=store, ladder=False
    )
    result = bring_up(session, request, launcher=run_in_process, store_evidence=False)
    manifest = resolve(session, parse_ref("llama/gptq:v1")).manifest
    tokenizer = load_tokenizer(manifest, read_tokenizer(session.store, manifest))
    assert (
        result.predicate["prompt"] == tokenizer.encode("hello world") and len(result.predicate["prompt"]) > 1
    )
    assert manifest.model.tokenizer is not None
    assert result.predicate["tokenizer"]["digest"] == str(manifest.model.tokenizer.digest)
    assert result.predicate["text"]["generated"] == tokenizer.decode(result.generated)
