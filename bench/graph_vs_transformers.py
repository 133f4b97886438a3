"""An independent reference for the runtime graph: transformers' LlamaForCausalLM on the same GGUF.

Builds a SmolLM-shaped GGUF (Q4_1 linears, tied Q8_0 embedding; llama.cpp's permuted Q/K), decodes
it with the registry's reference decoder, and runs (a) transformers' ``LlamaForCausalLM`` with those
weights, Q/K un-permuted by transformers' own GGUF tensor processor (what its GGUF loader does), and
(b) the graph alone (no Ray, no kernels: the decoded float model) as stored (interleaved rope) at tp 1,
2 and 3 over gloo processes. Prints max |dlogits|, top-1 agreement per position and whether the greedy
tokens match. Needs the ``compare`` extra. The test over the real bring-up (Ray ranks, quantized kernels,
transformers' own ``from_pretrained(gguf_file=...)``, and a GPTQ checkpoint) is
tests/deploy/test_vs_transformers.py.

    .venv/bin/python bench/graph_vs_transformers.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from llama_artifacts import gguf_smollm

from shardport.deploy.graph import reference_model
from shardport.deploy.graph.checkpoint import float_model
from shardport.deploy.local_ranks import Job, run_local
from shardport.registry.checkpoint.analysis import analyze, decode
from shardport.registry.contracts.graph import graph_contract

PROMPT = (3, 1000, 17, 256, 9, 511, 42, 7)
STEPS = 6
HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def transformers_run(contract, tensors):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    config = LlamaConfig(
        vocab_size=contract.vocab,
        hidden_size=contract.hidden,
        intermediate_size=contract.intermediate,
        num_hidden_layers=contract.layers,
        num_attention_heads=contract.heads,
        num_key_value_heads=contract.kv_heads,
        rms_norm_eps=contract.norm_eps,
        rope_theta=contract.rope_base,
        tie_word_embeddings=contract.tied_embeddings,
        max_position_embeddings=2048,
    )
    proc = LlamaTensorProcessor(
        {"num_attention_heads": contract.heads, "num_key_value_heads": contract.kv_heads}
    )
    state = {}
    for name, t in tensors.items():
        if name == "token_embd.weight":
            state["model.embed_tokens.weight"] = t
        elif name == "output_norm.weight":
            state["model.norm.weight"] = t
        else:
            _, layer, stem, _ = name.split(".")
            value = torch.from_numpy(proc.process(t.numpy(), name).weights.copy())
            state[f"model.layers.{layer}.{HF[stem]}.weight"] = value
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
        tokens, seq = [], list(PROMPT)
        for _ in range(STEPS):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            tokens.append(nxt)
            seq.append(nxt)
    return logits, tuple(tokens)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = gguf_smollm(Path(tmp) / "smol", layers=2, vocab=1001)
        analysis = analyze(root, ["model.gguf"], witnesses=False)
        assert analysis is not None
        contract = graph_contract(
            analysis.architecture, analysis.params, tensor_shapes={t.name: t.shape for t in analysis.tensors}
        )
        tensors = {
            w.name: torch.from_numpy(decode(root, analysis.tensors, analysis.weights, w.name)[1])
            for w in analysis.weights
        }
    ref_logits, ref_tokens = transformers_run(contract, tensors)
    model = float_model(contract, tensors)
    one = reference_model(model).generate(PROMPT, STEPS)
    runs = {1: [{"generation": one}]}
    for tp in (2, 3):
        (results,) = run_local([Job(model, tp=tp, prompt=PROMPT, steps=STEPS)])
        runs[tp] = results
    print(f"contract: {contract.model_dump()}")
    print(f"transformers greedy: {ref_tokens}; logit scale (std) {float(ref_logits.std()):.3f}")
    for tp, results in runs.items():
        for r, result in enumerate(results):
            g = result["generation"]
            diff = float((g.prompt_logits - ref_logits).abs().max())
            top1 = (g.prompt_logits.argmax(-1) == ref_logits.argmax(-1)).tolist()
            print(
                f"tp={tp} rank {r}: max|dlogits| {diff:.2e}, top-1 {sum(top1)}/{len(top1)}, "
                f"greedy {'identical' if g.tokens == ref_tokens else g.tokens}"
            )


if __name__ == "__main__":
    main()
