"""The driver's L4 reference run by transformers' own decoder layers against the graph's own reference.

Checkpoints pushed to a local store (a GPTQ llama, the GGUF mix with llama.cpp's permuted Q/K and a tied
Q8_0 embedding, a GPTQ Mixtral, a GPTQ Qwen2 with q/k/v bias) are streamed layer by layer through the loader
into ``LlamaDecoderLayer`` / ``MixtralDecoderLayer`` / ``Qwen2DecoderLayer``: the same logits as the
graph's streamed reference within float32 rounding, the same greedy tokens, at most one layer's float
weights alive. Random float models cover Mistral and rope scaling without a push.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bringup_artifacts import HIDDEN, LAYERS, gguf_tiny, gptq_mixtral, gptq_tiny
from graph_cases import DENSE
from llama_artifacts import ok
from safetensors.numpy import load_file, save_file

from shardport.deploy.contract import check_inventory, contract_of
from shardport.deploy.graph import compare, random_model, reference_model
from shardport.deploy.graph.model import Generation
from shardport.deploy.graph.reference import FloatModel
from shardport.deploy.rank_ops import policy_of
from shardport.deploy.reference_hf import hf_teacher_forced, transformers_classes
from shardport.deploy.reference_stream import FloatLedger, driver_reference, streamed_reference
from shardport.deploy.up_evidence import _graph_rows
from shardport.deploy.up_l5 import level5
from shardport.registry.artifact.refs import parse_ref
from shardport.registry.contracts.graph import GraphContract, RopeScaling
from shardport.registry.session import Session
from shardport.registry.trust.resolve import Resolved, resolve

PROMPT = (1, 5, 300, 7, 396)
STEPS = 4


def _qwen2(folder: Path) -> Path:
    """``gptq_tiny`` as a Qwen2 (its architecture, and float16 q/k/v biases under its own names)."""
    gptq_tiny(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(5)
    for layer in range(LAYERS):
        for op, width in (("q", HIDDEN), ("k", HIDDEN // 2), ("v", HIDDEN // 2)):
            bias = (rng.standard_normal(width) * 0.5).astype(np.float16)
            tensors[f"model.layers.{layer}.self_attn.{op}_proj.bias"] = bias
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    return folder


BUILDERS = {"gptq": gptq_tiny, "gguf-mix": gguf_tiny, "mixtral": gptq_mixtral, "qwen2-bias": _qwen2}


def _pushed(tmp: Path, kind: str) -> tuple[Session, Resolved, GraphContract]:
    store = str(tmp / "store")
    ok(store, "keygen")
    ok(store, "push", BUILDERS[kind](tmp / kind), f"m/{kind}:v1")
    session = Session.open(store)
    resolved = resolve(session, parse_ref(f"m/{kind}:v1"))
    contract = contract_of(resolved.manifest)
    check_inventory(contract, resolved.manifest)
    return session, resolved, contract


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the logits' size (float32 rounding of two implementations: ~1e-6)."""
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_transformers_reference_equals_the_graph_reference(home: Path, tmp_path: Path, kind: str) -> None:
    session, resolved, contract = _pushed(tmp_path, kind)
    run = (7, 11, 13, 17)  # both teacher-forced on the same tokens: the same argmax at each step
    graph = streamed_reference(session, resolved, contract, PROMPT, run)
    ledger = FloatLedger()
    hf, source = driver_reference(session, resolved, contract, PROMPT, run, ledger, chunk_bytes=2**16)
    layer = {"gptq": "LlamaDecoderLayer", "gguf-mix": "LlamaDecoderLayer", "mixtral": "MixtralDecoderLayer"}
    layer["qwen2-bias"] = "Qwen2DecoderLayer"
    assert source["kind"] == "transformers" and source["class"] == layer[kind], source
    prompt = _close(hf.prompt_logits, graph.prompt_logits)
    decode = _close(hf.token_logits, graph.token_logits)
    print(f"{kind}: transformers vs graph, relative max |Δ| prompt {prompt:.2e}, decode {decode:.2e}")
    assert hf.tokens == graph.tokens
    assert _close(hf.prompt_logits, graph.prompt_logits) <= 1e-5
    assert _close(hf.token_logits, graph.token_logits) <= 1e-5
    # memory: the graph reference's bound — one layer's float weights (or the head) at a time — plus,
    # for Mixtral, one expert matrix while it is copied into transformers' stacked experts
    graph_ledger = FloatLedger()
    streamed_reference(session, resolved, contract, PROMPT, run, graph_ledger, chunk_bytes=2**16)
    expert = 4 * contract.intermediate * contract.hidden if contract.moe else 0
    assert ledger.live == 0 and ledger.peak <= graph_ledger.peak + expert, (ledger, graph_ledger)


class _Stage(dict[str, torch.Tensor]):
    """One stage's float tensors by checkpoint name (what the loader's decoded stage gives)."""

    def need(self, name: str, rows: Sequence[int] | None = None) -> torch.Tensor:
        return self[name] if rows is None else self[name][list(rows)]

    def release(self, name: str) -> None:
        del self[name]


def _hf_stages(model: FloatModel) -> list[_Stage]:
    """A random float model's tensors by Hugging Face checkpoint names, one stage per layer."""
    out = []
    for i, f in enumerate(model.layers):
        at = f"model.layers.{i}."
        stage = _Stage({f"{at}self_attn.{op}_proj.weight": getattr(f, op) for op in "qkvo"})
        stage |= {
            f"{at}input_layernorm.weight": f.input_norm,
            f"{at}post_attention_layernorm.weight": f.post_norm,
        }
        stage |= {
            f"{at}self_attn.{op}_proj.bias": getattr(f, f"{op}_bias") for op in "qkv" if f.q_bias is not None
        }
        if f.mlp is not None:
            stage |= {f"{at}mlp.{w}_proj.weight": getattr(f.mlp, w) for w in ("gate", "up", "down")}
        else:
            stage[f"{at}block_sparse_moe.gate.weight"] = f.router
            for e, m in enumerate(f.experts):
                stage |= {
                    f"{at}block_sparse_moe.experts.{e}.{w}.weight": t
                    for w, t in zip(("w1", "w3", "w2"), (m.gate, m.up, m.down), strict=True)
                }
        out.append(stage)
    out[0]["model.embed_tokens.weight"] = model.embed
    out[-1]["model.norm.weight"] = model.norm
    if model.head is not None:
        out[-1]["lm_head.weight"] = model.head
    else:  # tied: the last stage holds the embedding again (as the placement plan puts it)
        out[-1]["model.embed_tokens.weight"] = model.embed
    return out


CASES = {
    "mistral": (DENSE.model_copy(update={"architecture": "MistralForCausalLM"}), "MistralDecoderLayer"),
    "llama3-rope": (
        DENSE.model_copy(
            update={
                "rope_scaling": RopeScaling(
                    kind="llama3",
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position=16,
                )
            }
        ),
        "LlamaDecoderLayer",
    ),
    "linear-rope": (
        DENSE.model_copy(update={"rope_scaling": RopeScaling(kind="linear", factor=4.0), "rope_base": 500.0}),
        "LlamaDecoderLayer",
    ),
    "qwen2-tied-bias": (
        DENSE.model_copy(
            update={"architecture": "Qwen2ForCausalLM", "tied_embeddings": True, "qkv_bias": True}
        ),
        "Qwen2DecoderLayer",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_layers_equal_the_graph_on_random_models(case: str) -> None:
    contract, layer = CASES[case]
    model = random_model(contract, seed=3)
    want = reference_model(model).generate(list(PROMPT), STEPS)
    classes = transformers_classes(contract)
    assert not isinstance(classes, str) and classes.source["class"] == layer, classes
    got = hf_teacher_forced(contract, classes, iter(_hf_stages(model)), PROMPT, want.tokens, lambda a: a)
    assert got.tokens == want.tokens
    assert _close(got.prompt_logits, want.prompt_logits) <= 1e-5
    assert _close(got.token_logits, want.token_logits) <= 1e-5


def _l5() -> dict[str, Any]:
    """L5's measures over no rank reports (the L4 rows are what these tests read)."""
    return level5([], policy_of("warn"))


def test_a_corrupted_decode_step_fails_l4_and_the_evidence_names_the_reference(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session, resolved, contract = _pushed(tmp_path, "gguf-mix")
    tokens: tuple[int, ...] = (0,) * STEPS
    for _ in range(STEPS):  # teacher forcing on its own argmax: one more greedy token right each pass
        reference, source = driver_reference(session, resolved, contract, PROMPT, tokens)
        tokens = reference.tokens
    # the run: the graph's own tp-1 forward on the same tokens (what the ranks compute), one decode
    # step's logits then corrupted by 0.05 (as a stale KV cache entry would shift them)
    run = streamed_reference(session, resolved, contract, PROMPT, tokens)
    assert run.tokens == tokens
    tolerance = 1e-3
    good = compare(run, reference, tolerance, source)
    assert good.ok and good.reference == source and source["kind"] == "transformers"
    corrupted = run.token_logits.clone()
    corrupted[2, 17] += 0.05
    bad = compare(Generation(run.prompt_logits, run.tokens, corrupted), reference, tolerance, source)
    assert bad.max_abs_diff <= tolerance and abs(bad.decode_max_abs_diff - 0.05) < 1e-3
    cache = [{"cache": {"max_abs_diff": 0.0, "tolerance": 1e-6}}]
    for parity, passed in ((good, True), (bad, False)):
        (row,) = [
            r
            for r in _graph_rows(cache, parity.model_dump(mode="json"), _l5())
            if r["name"].startswith("logits max")
        ]
        assert row["passed"] is passed, row
        assert f"reference: transformers, {source['version']}, LlamaDecoderLayer" in row["detail"], row
    assert f"decode max |Δ| {bad.decode_max_abs_diff:.3g}" in row["detail"]
    # transformers absent (the demo's install): the graph's own reference, and the evidence says why
    monkeypatch.setitem(sys.modules, "transformers", None)
    fallback, why = driver_reference(session, resolved, contract, PROMPT, tokens)
    assert why["kind"] == "shardport-graph" and "transformers" in why["why"], why
    assert torch.equal(fallback.token_logits, run.token_logits) and fallback.tokens == tokens
    parity = compare(run, fallback, tolerance, why).model_dump(mode="json")
    (row,) = [r for r in _graph_rows(cache, parity, _l5()) if r["name"].startswith("logits max")]
    assert row["passed"] and f"reference: shardport-graph, {why['why']}" in row["detail"], row
