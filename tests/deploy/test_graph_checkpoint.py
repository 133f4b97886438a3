"""A real GGUF (llama.cpp's layout: permuted Q/K, tied Q8_0 embedding) through the registry's reference
decoder into the graph: its rows as stored with interleaved rope equal the Hugging Face order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llama_artifacts import gguf_smollm

from shardport.deploy.errors import GraphWeightError
from shardport.deploy.graph import compare, random_model, reference_model, tp_split, unpermute_gguf_qk
from shardport.deploy.graph.checkpoint import float_model
from shardport.deploy.plan_layout import layout_from_plan
from shardport.placement import plan
from shardport.placement.topology import Topology
from shardport.registry.checkpoint.analysis import analyze, decode
from shardport.registry.contracts.graph import GraphContract, graph_contract


def test_gguf_file_runs_as_stored_and_unpermuted(tmp_path: Path) -> None:
    root = gguf_smollm(tmp_path / "smol", layers=2, vocab=1001)
    analysis = analyze(root, ["model.gguf"], witnesses=False)
    assert analysis is not None
    contract = graph_contract(
        analysis.architecture, analysis.params, tensor_shapes={t.name: t.shape for t in analysis.tensors}
    )
    assert contract.rope_pairs == "interleaved" and contract.tied_embeddings
    tensors = {
        w.name: torch.from_numpy(decode(root, analysis.tensors, analysis.weights, w.name)[1])
        for w in analysis.weights
    }
    stored = float_model(contract, tensors)
    heads = {"attn_q": contract.heads, "attn_k": contract.kv_heads}
    unpermuted = {
        name: unpermute_gguf_qk(t, heads[name.split(".")[-2]]) if name.split(".")[-2] in heads else t
        for name, t in tensors.items()
    }
    hf_order = float_model(contract.model_copy(update={"rope_pairs": "half"}), unpermuted)
    prompt = [3, 1000, 17, 256, 9, 511]
    a = reference_model(stored).generate(prompt, 4)
    parity = compare(reference_model(hf_order).generate(prompt, 4), a, tolerance=1e-4)
    assert parity.ok, parity
    assert float(a.prompt_logits.std()) > 0.05  # logits that say something (not all ~0)
    with pytest.raises(GraphWeightError, match=r"tensor blk\.1\.ffn_up\.weight"):
        float_model(contract, {k: v for k, v in tensors.items() if k != "blk.1.ffn_up.weight"})


@pytest.mark.parametrize("tp", [2, 3])
def test_the_plans_layout_is_the_graphs_split(tmp_path: Path, tp: int) -> None:
    root = gguf_smollm(tmp_path / "smol", layers=2, vocab=1001)
    analysis = analyze(root, ["model.gguf"], witnesses=False)
    assert analysis is not None
    contract = graph_contract(
        analysis.architecture, analysis.params, tensor_shapes={t.name: t.shape for t in analysis.tensors}
    )
    planned = plan((analysis.weights, analysis.tensors, analysis.params), Topology(tp=tp))
    split = tp_split(contract, tp)
    for rank in range(tp):
        assert layout_from_plan(planned, contract, rank) == split.layout(rank)
    inter = {s.ranges for s in planned.splits if s.key.endswith("mlp.intermediate")}
    assert inter == {split.intermediate}


def test_moe_names_hugging_face_and_gguf_stacked() -> None:
    moe = GraphContract(
        architecture="MixtralForCausalLM",
        source="config.json",
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=48,
        vocab=101,
        rope_base=10000.0,
        rope_pairs="half",
        norm_eps=1e-5,
        tied_embeddings=False,
        experts=3,
        experts_per_token=2,
    )
    m = random_model(moe, seed=4)
    hf: dict[str, torch.Tensor] = {"model.embed_tokens.weight": m.embed, "model.norm.weight": m.norm}
    gg: dict[str, torch.Tensor] = {"token_embd.weight": m.embed, "output_norm.weight": m.norm}
    assert m.head is not None
    hf["lm_head.weight"], gg["output.weight"] = m.head, m.head
    for i, f in enumerate(m.layers):
        p = f"model.layers.{i}."
        assert f.router is not None
        hf.update(
            {
                p + "self_attn.q_proj.weight": f.q,
                p + "self_attn.k_proj.weight": f.k,
                p + "self_attn.v_proj.weight": f.v,
                p + "self_attn.o_proj.weight": f.o,
                p + "input_layernorm.weight": f.input_norm,
                p + "post_attention_layernorm.weight": f.post_norm,
                p + "block_sparse_moe.gate.weight": f.router,
            }
        )
        for e, x in enumerate(f.experts):
            for w, t in (("w1", x.gate), ("w3", x.up), ("w2", x.down)):
                hf[f"{p}block_sparse_moe.experts.{e}.{w}.weight"] = t
        b = f"blk.{i}."
        gg.update(
            {
                b + "attn_q.weight": f.q,
                b + "attn_k.weight": f.k,
                b + "attn_v.weight": f.v,
                b + "attn_output.weight": f.o,
                b + "attn_norm.weight": f.input_norm,
                b + "ffn_norm.weight": f.post_norm,
                b + "ffn_gate_inp.weight": f.router,
            }
        )
        for w in ("gate", "up", "down"):
            gg[f"{b}ffn_{w}_exps.weight"] = torch.stack([getattr(x, w) for x in f.experts])
    prompt = [1, 50, 100, 7]
    want = reference_model(m).forward(prompt, reference_model(m).new_cache())
    for contract, tensors in ((moe, hf), (moe.model_copy(update={"source": "gguf"}), gg)):
        got = float_model(contract, tensors)
        model = reference_model(got)
        assert torch.equal(model.forward(prompt, model.new_cache()), want)
