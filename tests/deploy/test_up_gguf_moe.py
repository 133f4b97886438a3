"""A llama.cpp MoE GGUF (stacked ``ffn_{gate,up,down}_exps`` ``[E, N, K]``) brought up over ep ranks.

Each rank gets the experts its ep rank owns of every stacked tensor, as one plane ``[E_local,
N_local · row_bytes]``; the bring-up runs each expert as its own ``[N, K]`` weight (a view of the
plane, named ``blk.0.ffn_gate_exps.weight[expert 3]``) through the same kernels as dense GGUF. The
float reference L4 compares against is checked against the gguf package's own dequantization and a
numpy forward of one layer's mixture of experts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bringup_artifacts import HIDDEN, MOE_INTER, gguf_mixtral
from llama_artifacts import cli, ok

from shardport.deploy.contract import check_inventory, contract_of
from shardport.deploy.errors import GraphLayoutError, UnsupportedModelError
from shardport.deploy.rank_experts import expert_name, expert_weight, split_experts
from shardport.deploy.rank_ops import policy_of, prepare_ops, run_ladders
from shardport.deploy.ray_ranks import run_in_process
from shardport.deploy.up import UpRequest, bring_up, ray_launcher
from shardport.loader import load_rank
from shardport.placement import Topology
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.contracts.decode import decode_weight
from shardport.registry.evidence import read_evidence
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved, resolve

PROMPT = (1, 5, 300, 7, 396)
#: Classic block types only: every expert tensor splits along N and K at tp 2 (no 256-superblock).
CLASSIC = {"ffn_gate_exps": ("Q4_0",), "ffn_up_exps": ("Q8_0", "Q4_1"), "ffn_down_exps": ("Q8_0", "Q4_0")}


def _push(home: Path, folder: Path, ref: str) -> tuple[str, Resolved]:
    store = str(folder.parent / "store")
    if not (home / "keys").exists():
        ok(store, "keygen")
    ok(store, "push", folder, ref)
    return store, resolve(Session.open(store), parse_ref(ref))


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


def _gguf_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the file dequantized by the gguf package, logical row-major shape."""
    import gguf
    from gguf.quants import dequantize

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        out[t.name] = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy
    return out


def test_a_rank_of_ep2_runs_each_owned_expert_as_a_view_of_the_stacked_planes(
    home: Path, tmp_path: Path
) -> None:
    folder = gguf_mixtral(tmp_path / "moe")
    store, resolved = _push(home, folder, "llama/gmoe:v1")
    weights = {w.name: w for w in resolved.manifest.weights or []}
    loaded = load_rank(Session.open(store), resolved, Topology(tp=1, ep=2), 1)
    stacked = {t.tensor: t for t in loaded.tensors if "_exps" in t.tensor}
    assert len(stacked) == 6  # 3 stacked tensors x 2 layers, each read as the rank's experts 2..3
    gate = stacked["blk.0.ffn_gate_exps.weight"]
    assert gate.index == ((2, 4), (0, MOE_INTER), (0, HIDDEN)) and gate.array.dtype == np.uint8
    assert gate.array.shape == (2, MOE_INTER * (HIDDEN // 32) * 18)  # Q4_0: 18 bytes per 32 columns
    bounds = {"E": (2, 4), "N": (0, MOE_INTER), "K": (0, HIDDEN)}
    views = split_experts({gate.tensor: ({gate.tensor: gate.array}, bounds)})
    assert sorted(views) == [expert_name(gate.tensor, 2), expert_name(gate.tensor, 3)]
    planes, local = views[expert_name(gate.tensor, 3)]
    assert local == {"N": (0, MOE_INTER), "K": (0, HIDDEN)}
    assert planes[gate.tensor].shape == (MOE_INTER, (HIDDEN // 32) * 18)
    assert np.shares_memory(planes[gate.tensor], gate.array)  # a view of the loaded plane, no copy
    reference = _gguf_tensors(folder / "model.gguf")
    for name in ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight", "blk.1.ffn_down_exps.weight"):
        t = stacked[name]
        one = split_experts({name: ({name: t.array}, dict(zip("ENK", t.index, strict=True)))})
        for e in (2, 3):
            view_planes, _ = one[expert_name(name, e)]
            decoded = decode_weight(expert_weight(weights[name], e), view_planes)
            np.testing.assert_array_equal(decoded, reference[name][e])  # Q4_0, Q4_K, Q6_K per expert

    # int4pack preferred (as a manifest's kernels_preferred would): in float32, its slow path, the Q4_0
    # and Q4_1 experts would otherwise run on the GGUF direct kernel; here the repack from a view is tested
    ops = prepare_ops(loaded, weights, policy=policy_of("warn"), preferred=("cpu.int4pack",))
    experts = sorted(n for n in ops.ops if "_exps" in n)
    assert experts == sorted(
        expert_name(f"blk.{layer}.ffn_{w}_exps.weight", e) for layer in (0, 1) for w in ("gate", "up", "down")
        for e in (2, 3)
    )  # fmt: skip
    kernels = {t.weight.split("[N=")[0]: t.selected for t in ops.traces}
    slow = [t for t in ops.traces if t.selected == "cpu.int4pack@1"]
    assert slow and all(
        w.endswith("slow path for float32: the manifest prefers it") for t in slow for w in t.warnings
    )
    assert kernels[expert_name("blk.0.ffn_gate_exps.weight", 2)] == "cpu.int4pack@1"  # Q4_0
    assert kernels[expert_name("blk.1.ffn_gate_exps.weight", 3)] == "cpu.int4pack@1"  # Q4_1
    assert kernels[expert_name("blk.0.ffn_up_exps.weight", 2)] == "cpu.gguf-direct@1"  # Q8_0
    assert kernels[expert_name("blk.0.ffn_down_exps.weight", 3)] == "cpu.gguf-direct@1"  # Q4_K
    assert kernels[expert_name("blk.1.ffn_down_exps.weight", 2)] == "cpu.gguf-direct@1"  # Q6_K
    assert "blk.0.ffn_gate_inp.weight" in ops.floats  # the F32 router, replicated
    run_ladders(loaded, weights, ops)
    expert_ladders = [lad for lad in ops.ladders if "_exps" in lad.weight]
    assert expert_ladders and all(lad.passed for lad in expert_ladders)
    assert all(lad.l2.witness_kind == "cells" and lad.l2.witness_checked > 0 for lad in expert_ladders)


def test_expert_views_refuse_a_plane_without_the_ranks_experts_first(home: Path, tmp_path: Path) -> None:
    from shardport.deploy.errors import GraphWeightError
    from shardport.deploy.rank_experts import ExpertWeights, parse_expert_name

    bounds = {"E": (2, 4), "N": (0, 8), "K": (0, 32)}
    with pytest.raises(
        GraphWeightError, match=r"tensor blk\.0\.ffn_up_exps\.weight: loaded shape \[3, 272\]"
    ):
        split_experts(
            {"blk.0.ffn_up_exps.weight": ({"blk.0.ffn_up_exps.weight": np.zeros((3, 272), np.uint8)}, bounds)}
        )
    assert parse_expert_name("blk.0.ffn_up_exps.weight[expert 12]") == ("blk.0.ffn_up_exps.weight", 12)
    assert parse_expert_name("blk.0.ffn_up_exps.weight") is None
    _, resolved = _push(home, gguf_mixtral(tmp_path / "moe"), "llama/gmoe:v1")
    weights = ExpertWeights({w.name: w for w in resolved.manifest.weights or []})
    one = weights[expert_name("blk.1.ffn_down_exps.weight", 3)]
    assert one.shape.extents == (HIDDEN, MOE_INTER) and one.binding.expert == 3
    assert one.planes[0].shape == (HIDDEN, MOE_INTER) and one.witness is not None and one.witness.experts == 1
    with pytest.raises(GraphWeightError, match=r"expert 4 outside 0\.\.3"):
        weights[expert_name("blk.1.ffn_down_exps.weight", 4)]
    with pytest.raises(KeyError):
        weights["blk.9.ffn_down_exps.weight[expert 0]"]


def test_the_inventory_check_reads_llama_cpp_moe_names(home: Path, tmp_path: Path) -> None:
    _, resolved = _push(home, gguf_mixtral(tmp_path / "moe", tied=True), "llama/gmoe:v1")
    manifest = resolved.manifest
    contract = contract_of(manifest)
    assert contract.moe and contract.experts == 4 and contract.experts_per_token == 2
    check_inventory(contract, manifest)
    fewer = manifest.model_copy(
        update={"weights": [w for w in manifest.weights or [] if w.name != "blk.1.ffn_up_exps.weight"]}
    )
    with pytest.raises(UnsupportedModelError, match=r"missing \['blk\.1\.ffn_up_exps\.weight'\]"):
        check_inventory(contract, fewer)


def test_a_k_quant_expert_split_inside_its_superblock_is_refused_at_plan_time(
    home: Path, tmp_path: Path
) -> None:
    store, _ = _push(home, gguf_mixtral(tmp_path / "moe"), "llama/gmoe:v1")
    request = UpRequest(ref="llama/gmoe:v1", tokens=PROMPT, tp=2, ep=2, store=store)
    refused = r"--tp 2: the artifact can be placed at tp in \[1\]"  # the topology layer, before any rank
    with pytest.raises(GraphLayoutError, match=refused) as caught:
        bring_up(Session.open(store), request, launcher=run_in_process)
    message = str(caught.value)
    assert "blk.0.ffn_down_exps.weight" in message and "K=256" in message and "Q4_K" in message
    assert "use tp in [1]" in message


def test_the_float_reference_of_a_gguf_moe_matches_the_files_own_dequantization_and_a_numpy_moe(
    home: Path, tmp_path: Path
) -> None:
    from shardport.deploy.graph.checkpoint import float_model
    from shardport.deploy.graph.reference import reference_model
    from shardport.deploy.graph.weights import Experts

    folder = gguf_mixtral(tmp_path / "moe")
    store, resolved = _push(home, folder, "llama/gmoe:v1")
    contract = contract_of(resolved.manifest)
    whole = load_rank(Session.open(store), resolved, Topology(tp=1), 0)  # as the driver's reference
    planes: dict[str, dict[str, Any]] = {}
    for t in whole.tensors:
        if t.weight is not None:
            planes.setdefault(t.weight, {})[t.tensor] = t.array
    weights = {w.name: w for w in resolved.manifest.weights or []}
    tensors = {
        n: torch.from_numpy(np.ascontiguousarray(decode_weight(weights[n], p))) for n, p in planes.items()
    }
    model = float_model(contract, tensors)
    gguf_values = _gguf_tensors(folder / "model.gguf")
    x = np.random.default_rng(0).standard_normal((7, HIDDEN)).astype(np.float32)
    for layer in (0, 1):
        router = gguf_values[f"blk.{layer}.ffn_gate_inp.weight"]
        gate, up, down = (gguf_values[f"blk.{layer}.ffn_{w}_exps.weight"] for w in ("gate", "up", "down"))
        f = model.layers[layer]
        assert f.router is not None and len(f.experts) == 4
        np.testing.assert_array_equal(f.router.numpy(), router)
        for e, m in enumerate(f.experts):
            np.testing.assert_array_equal(m.gate.numpy(), gate[e])
            np.testing.assert_array_equal(m.up.numpy(), up[e])
            np.testing.assert_array_equal(m.down.numpy(), down[e])
        # Mixtral routing in numpy, float64: softmax over all experts, keep the top 2, renormalise
        logits = x.astype(np.float64) @ router.T.astype(np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        expected = np.zeros((x.shape[0], HIDDEN))
        for row in range(x.shape[0]):
            top = np.argsort(-probs[row])[:2]
            for e in top:
                g, u = gate[e].astype(np.float64) @ x[row], up[e].astype(np.float64) @ x[row]
                y = down[e].astype(np.float64) @ (g / (1 + np.exp(-g)) * u)
                expected[row] += probs[row, e] / probs[row, top].sum() * y
        ref = reference_model(model)
        moe = ref.weights.layers[layer].mlp
        assert isinstance(moe, Experts)
        got = ref._experts(layer, moe, torch.from_numpy(x))  # one layer's mixture of experts, as L4 runs it
        scale = float(np.abs(expected).max())
        assert scale > 1e-2
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5 * scale, rtol=0)


@pytest.mark.ray
@pytest.mark.slow
def test_gguf_moe_up_over_two_expert_parallel_ranks_proves_parity_and_stores_evidence(
    home: Path, tmp_path: Path, ray_ranks: Any
) -> None:
    store, _ = _push(home, gguf_mixtral(tmp_path / "moe"), "llama/gmoe:v1")
    session = Session.open(store)
    tokens = ",".join(map(str, PROMPT))
    code, doc = cli(store, "up", "llama/gmoe:v1", "--ep", "2", "--tokens", tokens, "--generate", "3")
    assert code == 0, doc
    _all_pass(doc["parity"])
    assert doc["topology"] == {"tp": 1, "ep": 2, "pp": 1} and len(doc["generated"]) == 3
    assert all(float(a) <= 1.05 for a in doc["read_amplification"].values())  # only the rank's experts read
    experts: dict[int, set[int]] = {0: set(), 1: set()}
    kernels: dict[str, set[str]] = {}
    for row in doc["dispatch"]:
        name = row["weight"].split("[N=")[0]
        if "[expert " in name:
            experts[row["rank"]].add(int(name.split("[expert ")[1].rstrip("]")))
            kernels.setdefault(name.split(".weight")[0], set()).add(row["kernel"])
    assert experts == {0: {0, 1}, 1: {2, 3}}  # each ep rank prepared only its own experts
    assert kernels == {  # float32: Q4_0/Q4_1 on the direct kernel too (int4pack's slow path comes after it)
        "blk.0.ffn_gate_exps": {"cpu.gguf-direct@1"},  # Q4_0
        "blk.1.ffn_gate_exps": {"cpu.gguf-direct@1"},  # Q4_1
        "blk.0.ffn_up_exps": {"cpu.gguf-direct@1"},  # Q8_0
        "blk.1.ffn_up_exps": {"cpu.gguf-direct@1"},  # Q4_0
        "blk.0.ffn_down_exps": {"cpu.gguf-direct@1"},  # Q4_K
        "blk.1.ffn_down_exps": {"cpu.gguf-direct@1"},  # Q6_K
    }
    # 2 layers x 3 stacked tensors x 2 experts per rank x 2 ranks x 2 phases
    assert len([r for r in doc["dispatch"] if "[expert " in r["weight"]]) == 2 * 3 * 2 * 2 * 2
    evidence = read_evidence(session, "llama/gmoe", doc["digest"])
    assert len(evidence.verified) == 1
    stored = evidence.verified[0].predicate
    assert stored["passed"] and stored["topology"] == {"tp": 1, "ep": 2, "pp": 1}
    l5 = stored["l5"]
    assert l5["unexpected_kernels"] == [] and l5["fallbacks"].get("full-dequant", 0) == 0
    # every expert's trace is checked against its pin, or counted as one no pin covers (a tp > 1 slice)
    assert l5["traces_checked"] + l5["traces_not_pinned"] == len(doc["dispatch"])
    assert ok(store, "verify", "llama/gmoe:v1")["evidence_verified"] == 1


@pytest.mark.ray
@pytest.mark.slow
def test_gguf_moe_up_at_ep2_by_tp2_with_tied_embeddings(home: Path, tmp_path: Path, ray_ranks: Any) -> None:
    store, _ = _push(home, gguf_mixtral(tmp_path / "moe", tied=True, types=CLASSIC), "llama/gmoe:v1")
    request = UpRequest(ref="llama/gmoe:v1", tokens=PROMPT, steps=3, tp=2, ep=2, store=store)
    result = bring_up(Session.open(store), request, launcher=ray_launcher(None))
    _all_pass(result.predicate["parity"])
    rows = {
        (r["rank"], r["weight"].split("[N=")[0], "[N=" + r["weight"].split("[N=")[1])
        for r in result.predicate["dispatch"]
        if r["weight"].startswith("blk.0.ffn_") and r["phase"] == "decode"
    }
    half = MOE_INTER // 2
    gate, down = "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight"
    assert (3, expert_name(gate, 3), f"[N={half}:{MOE_INTER}, K=0:{HIDDEN}]") in rows  # ep 1, tp 1
    assert (2, expert_name(down, 2), f"[N=0:{HIDDEN}, K=0:{half}]") in rows  # ep 1, tp 0
    assert {e for (rank, name, _) in rows if rank == 1 for e in (name,) if "[expert " in e} == {
        expert_name(f"blk.0.ffn_{w}_exps.weight", e) for w in ("gate", "up", "down") for e in (0, 1)
    }


@pytest.mark.slow
def test_the_l4_reference_of_a_gguf_moe_agrees_with_transformers_mixtral(home: Path, tmp_path: Path) -> None:
    """transformers' MixtralForCausalLM, fed the gguf package's dequantization of the file (Q/K
    un-permuted by transformers' own GGUF tensor processor), against the bring-up's float reference."""
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from shardport.deploy.up import reference_generation

    folder = gguf_mixtral(tmp_path / "moe")
    store, resolved = _push(home, folder, "llama/gmoe:v1")
    contract = contract_of(resolved.manifest)
    values = _gguf_tensors(folder / "model.gguf")
    proc = LlamaTensorProcessor(
        {"num_attention_heads": contract.heads, "num_key_value_heads": contract.kv_heads}
    )
    hf = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj"}
    hf |= {"attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm"}
    hf |= {"ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    state: dict[str, torch.Tensor] = {"lm_head.weight": torch.from_numpy(values["output.weight"])}
    for name, v in values.items():
        if name in top:
            state[top[name]] = torch.from_numpy(v)
        elif name.startswith("blk."):
            _, layer, stem, _ = name.split(".")
            at = f"model.layers.{layer}"
            if stem in hf:
                state[f"{at}.{hf[stem]}.weight"] = torch.from_numpy(proc.process(v, name).weights.copy())
    for layer in range(contract.layers):
        gate, up = (values[f"blk.{layer}.ffn_{w}_exps.weight"] for w in ("gate", "up"))
        state[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.concatenate([gate, up], 1)
        )
        state[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.from_numpy(
            values[f"blk.{layer}.ffn_down_exps.weight"]
        )
    config = MixtralConfig(
        vocab_size=contract.vocab,
        hidden_size=contract.hidden,
        intermediate_size=contract.intermediate,
        num_hidden_layers=contract.layers,
        num_attention_heads=contract.heads,
        num_key_value_heads=contract.kv_heads,
        num_local_experts=contract.experts,
        num_experts_per_tok=contract.experts_per_token,
        rms_norm_eps=contract.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": contract.rope_base},
        max_position_embeddings=256,
    )
    model = MixtralForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    with torch.no_grad():
        theirs = model(torch.tensor([PROMPT])).logits[0]
        seq = list(PROMPT)
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    # the reference is teacher-forced on a run's tokens: transformers' greedy ones; its own argmax at
    # each decode position must give them back
    ours, source = reference_generation(Session.open(store), resolved, contract, PROMPT, seq[len(PROMPT) :])
    assert source["kind"] == "transformers" and source["class"] == "MixtralDecoderLayer", source
    scale, diff = float(theirs.abs().max()), float((ours.prompt_logits - theirs).abs().max())
    print(f"GGUF MoE reference vs transformers Mixtral: max |dlogits| {diff:.3g} (max |logit| {scale:.3g})")
    assert diff <= 1e-4 * max(1.0, scale)
    assert ours.prompt_logits.argmax(-1).tolist() == theirs.argmax(-1).tolist()
    assert list(ours.tokens) == seq[len(PROMPT) :]
