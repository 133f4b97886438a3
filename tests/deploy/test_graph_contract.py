"""The graph contract from GGUF metadata (a real file, through the push analysis) and config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_artifacts import gguf_smollm

from shardport.registry.checkpoint.analysis import analyze
from shardport.registry.checkpoint.describe import model_of
from shardport.registry.contracts.errors import (
    ContractError,
    GraphContractError,
    UnsupportedArchitectureError,
    UnsupportedOperatorError,
)
from shardport.registry.contracts.graph import GraphContract, RopeScaling, graph_contract

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 144,
    "intermediate_size": 200,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "vocab_size": 1001,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "torch_dtype": "bfloat16",
}
GGUF_KEYS: dict[str, Any] = {
    "llama.block_count": 2,
    "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
}
SHAPES = {"token_embd.weight": (1001, 576), "output.weight": (1001, 576)}


def test_gguf_metadata_of_a_real_file(tmp_path: Path) -> None:
    root = gguf_smollm(tmp_path / "smol", layers=2, vocab=1001)
    analysis = analyze(root, ["model.gguf"], witnesses=False)
    assert analysis is not None
    shapes = {t.name: t.shape for t in analysis.tensors}
    c = graph_contract(analysis.architecture, analysis.params, tensor_shapes=shapes)
    assert c.norm_eps == pytest.approx(1e-5)  # stored as float32
    assert c.model_copy(update={"norm_eps": 1e-5}) == GraphContract(
        architecture="llama",
        source="gguf",
        layers=2,
        hidden=576,
        heads=9,
        kv_heads=3,
        head_dim=64,
        intermediate=1536,
        vocab=1001,
        rope_base=10000.0,
        rope_pairs="interleaved",
        norm_eps=1e-5,
        tied_embeddings=True,
    )
    assert c.group == 3 and not c.moe


def test_config_json_as_the_manifest_records_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    model = model_of(tmp_path, {})  # what push records: model.architecture and model.params
    c = graph_contract(
        model.architecture, model.params, tensor_shapes={"model.embed_tokens.weight": (1001, 144)}
    )
    assert (c.source, c.architecture, c.rope_pairs) == ("config.json", "LlamaForCausalLM", "half")
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.intermediate, c.vocab) == (
        2,
        144,
        6,
        3,
        24,
        200,
        1001,
    )
    assert (c.rope_base, c.norm_eps, c.tied_embeddings) == (500000.0, 1e-5, True)
    assert c.rope_scaling == RopeScaling(
        kind="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    )
    # the record is plain data that round-trips (it is meant for the manifest and evidence)
    assert GraphContract.model_validate_json(c.model_dump_json()) == c


def test_defaults_moe_and_explicit_head_dim() -> None:
    mixtral = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "vocab_size": 1001,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    c = graph_contract("MixtralForCausalLM", mixtral)
    assert (c.experts, c.experts_per_token, c.head_dim, c.moe) == (4, 2, 48, True)
    assert (c.rope_base, c.norm_eps, c.tied_embeddings, c.rope_scaling) == (10000.0, 1e-6, False, None)
    g = graph_contract(
        "llama", {**GGUF_KEYS, "llama.expert_count": 8, "llama.expert_used_count": 2}, tensor_shapes=SHAPES
    )
    assert (g.experts, g.experts_per_token, g.tied_embeddings, g.vocab) == (8, 2, False, 1001)
    qwen = graph_contract(
        "qwen2", {**{k.replace("llama.", "qwen2."): v for k, v in GGUF_KEYS.items()}}, tensor_shapes=SHAPES
    )
    assert (qwen.rope_pairs, qwen.qkv_bias) == ("half", True)  # qwen2 GGUFs keep the Hugging Face row order
    linear = graph_contract(
        "llama",
        {**GGUF_KEYS, "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
        tensor_shapes=SHAPES,
    )
    assert linear.rope_scaling == RopeScaling(kind="linear", factor=4.0)
    vocab = graph_contract("llama", GGUF_KEYS, tensor_shapes={"output.weight": (1001, 576)}, vocab_size=1001)
    assert vocab.vocab == 1001 and not vocab.tied_embeddings


CONFIG = {k: v for k, v in LLAMA.items() if k not in ("rope_scaling", "architectures", "model_type")}


@pytest.mark.parametrize(
    ("architecture", "params", "shapes", "error", "needle"),
    [
        ("GPT2LMHeadModel", CONFIG, None, UnsupportedArchitectureError, "GPT2LMHeadModel"),
        (None, CONFIG, None, UnsupportedArchitectureError, "names no architecture"),
        ("falcon", {"falcon.block_count": 2}, SHAPES, UnsupportedArchitectureError, "falcon"),
        (
            "LlamaForCausalLM",
            {**CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            None,
            UnsupportedOperatorError,
            "'yarn'",
        ),
        ("llama", {**GGUF_KEYS, "llama.rope.scaling.type": "yarn"}, SHAPES, UnsupportedOperatorError, "yarn"),
        (
            "llama",
            {**GGUF_KEYS, "llama.rope.dimension_count": 32},
            SHAPES,
            UnsupportedOperatorError,
            "partial rotary",
        ),
        ("llama", GGUF_KEYS, {**SHAPES, "rope_freqs.weight": (32,)}, UnsupportedOperatorError, "rope_freqs"),
        (
            "llama",
            {**GGUF_KEYS, "llama.attention.head_count_kv": [3, 3]},
            SHAPES,
            UnsupportedOperatorError,
            "per-layer",
        ),
        ("MistralForCausalLM", {**CONFIG, "sliding_window": 4096}, None, UnsupportedOperatorError, "sliding"),
        ("LlamaForCausalLM", {**CONFIG, "hidden_act": "gelu"}, None, UnsupportedOperatorError, "hidden_act"),
        (
            "Qwen2ForCausalLM",
            {**CONFIG, "num_local_experts": 4},
            None,
            UnsupportedOperatorError,
            "no experts",
        ),
        (
            "LlamaForCausalLM",
            {**CONFIG, "num_key_value_heads": 4},
            None,
            GraphContractError,
            "not a multiple",
        ),
        (
            "LlamaForCausalLM",
            {k: v for k, v in CONFIG.items() if k != "num_hidden_layers"},
            None,
            GraphContractError,
            "num_hidden_layers: expected an integer, found nothing",
        ),
        ("LlamaForCausalLM", {**CONFIG, "hidden_size": "144"}, None, GraphContractError, "hidden_size"),
        (
            "LlamaForCausalLM",
            {**CONFIG, "rms_norm_eps": float("nan")},
            None,
            GraphContractError,
            "rms_norm_eps",
        ),
        (
            "LlamaForCausalLM",
            CONFIG,
            {"model.embed_tokens.weight": (1000, 144)},
            GraphContractError,
            "model.embed_tokens.weight",
        ),
        ("llama", GGUF_KEYS, None, GraphContractError, "tensor_shapes"),
        (
            "llama",
            {k: v for k, v in GGUF_KEYS.items() if "epsilon" not in k},
            SHAPES,
            GraphContractError,
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "MixtralForCausalLM",
            {**CONFIG, "num_local_experts": 4, "num_experts_per_tok": 5},
            None,
            GraphContractError,
            "experts_per_token",
        ),
    ],
)
def test_refusals_are_typed_and_say_what(
    architecture: str | None, params: dict[str, Any], shapes: Any, error: type[Exception], needle: str
) -> None:
    with pytest.raises(error, match=None) as info:
        graph_contract(architecture, params, tensor_shapes=shapes)
    assert needle in str(info.value)
    assert isinstance(info.value, ContractError) and info.value.exit_code == 5  # refused input
