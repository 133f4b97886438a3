"""Tiny llama-family checkpoints for bring-up tests: a GGUF of the mixes real files have, and GPTQ."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf_artifacts import tensor_data
from llama_artifacts import linear_shapes
from quantized import awq_planes, gptq_planes, quantize_minmax
from safetensors.numpy import save_file

HIDDEN, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 192, 6, 3, 768, 397, 2
"""hidden 192 (6 heads of 32, 3 kv heads: GQA), intermediate 768 (three Q4_K/Q6_K superblocks), odd vocab."""

#: Per slot the GGUF type: classic blocks on K = hidden, K-quants where K = intermediate (256-blocks).
GGUF_TYPES = {
    "attn_q": "Q4_0",
    "attn_k": "Q4_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_1",
    "ffn_gate": "Q4_0",
    "ffn_up": "Q8_0",
    "ffn_down": ("Q4_K", "Q6_K"),
}


def gguf_tiny(folder: Path, *, seed: int = 3, types: dict[str, object] | None = None) -> Path:
    """A 2-layer llama GGUF as llama.cpp writes one: mixed Q4_0/Q4_1/Q8_0/Q4_K/Q6_K linears, a tied
    Q8_0 token embedding (no ``output.weight``), F32 norms."""
    import gguf

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q80 = gguf.GGMLQuantizationType.Q8_0
    embed = quantize_scaled("Q8_0", (VOCAB, HIDDEN), rng, 1.0)
    w.add_tensor("token_embd.weight", embed, raw_dtype=q80)
    shapes = linear_shapes(HIDDEN, INTER, KV_HEADS * head_dim, gguf=True)
    for layer in range(LAYERS):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for stem, shape in shapes.items():
            kind = (types or GGUF_TYPES)[stem]
            name = kind[layer % len(kind)] if isinstance(kind, tuple) else str(kind)
            qtype = gguf.GGMLQuantizationType[name]
            w.add_tensor(
                f"blk.{layer}.{stem}.weight", quantize_scaled(name, shape, rng, 5.0), raw_dtype=qtype
            )
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def quantize_scaled(name: str, shape: tuple[int, int], rng: np.random.Generator, scale: float) -> np.ndarray:
    """``tensor_data`` (values ~ N(0, 0.02)) for the classic types, scaled up so logits spread."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    if name in ("Q4_K", "Q6_K"):
        return tensor_data(name, shape, rng)
    values = (rng.standard_normal(shape) * 0.02 * scale).astype(np.float32)
    return quantize(values, GGMLQuantizationType[name])


def gptq_tiny(folder: Path, *, seed: int = 5, bits: int = 4, inter: int = INTER) -> Path:
    """A 2-layer GPTQ llama safetensors checkpoint (``bits``-bit, group 64), float16 embeddings and head
    (``inter`` = 704, 11 groups: an even tp 2 or tp 3 split of the MLP would cut a group)."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16),
        "lm_head.weight": (rng.standard_normal((VOCAB, HIDDEN)) * 0.1).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float16),
    }
    shapes = linear_shapes(HIDDEN, inter, KV_HEADS * head_dim)
    for layer in range(LAYERS):
        for slot, (n, k) in shapes.items():
            case = quantize_minmax((rng.standard_normal((n, k)) * 0.1).astype(np.float32), 64, bits)
            tensors.update(gptq_planes(case, f"model.layers.{layer}.{slot}"))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = np.ones(HIDDEN, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN,
        "intermediate_size": inter,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "quantization_config": {
            "quant_method": "gptq",
            "bits": bits,
            "group_size": 64,
            "desc_act": False,
            "checkpoint_format": "gptq",
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def add_tokenizer_json(folder: Path, vocab: int = 300) -> Path:
    """A small byte-level BPE ``tokenizer.json`` (ids < ``vocab`` <= the model's vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
        show_progress=False,
    )
    tok.train_from_iterator(["hello world, hello tokens", "the cat sat on the mat"] * 4, trainer)
    (folder / "tokenizer.json").write_text(tok.to_str())
    return folder


def gptq_mixtral(folder: Path, *, seed: int = 9, experts: int = 4, top_k: int = 2) -> Path:
    """A 2-layer GPTQ Mixtral: 4-bit experts (w1/w3/w2), float16 router, attention, embeddings, head."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    inter = 256
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16),
        "lm_head.weight": (rng.standard_normal((VOCAB, HIDDEN)) * 0.1).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float16),
    }
    shapes = {
        "self_attn.q_proj": (HIDDEN, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * head_dim, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * head_dim, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HIDDEN),
    }
    shapes |= {
        f"block_sparse_moe.experts.{e}.w{i}": s
        for e in range(experts)
        for i, s in ((1, (inter, HIDDEN)), (3, (inter, HIDDEN)), (2, (HIDDEN, inter)))
    }
    for layer in range(LAYERS):
        for slot, (n, k) in shapes.items():
            case = quantize_minmax((rng.standard_normal((n, k)) * 0.1).astype(np.float32), 64)
            tensors.update(gptq_planes(case, f"model.layers.{layer}.{slot}"))
        tensors[f"model.layers.{layer}.block_sparse_moe.gate.weight"] = rng.standard_normal(
            (experts, HIDDEN)
        ).astype(np.float16)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = np.ones(HIDDEN, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["MixtralForCausalLM"],
        "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN,
        "intermediate_size": inter,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "quantization_config": {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 64,
            "desc_act": False,
            "checkpoint_format": "gptq",
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


#: GGUF MoE (:func:`gguf_mixtral`): the type of each stacked expert tensor per layer, as llama.cpp's
#: Q4_K_M-like mixes spread them (K-quants where K = the expert intermediate, 256-blocks).
GGUF_EXPERT_TYPES = {
    "ffn_gate_exps": ("Q4_0", "Q4_1"),
    "ffn_up_exps": ("Q8_0", "Q4_0"),
    "ffn_down_exps": ("Q4_K", "Q6_K"),
}
MOE_INTER = 256
"""The experts' intermediate size (one Q4_K/Q6_K superblock along K of ``ffn_down_exps``)."""


def _stacked(name: str, experts: int, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[E, N, row_bytes]`` uint8 blocks of one stacked expert tensor (every expert quantized alone)."""
    return np.stack([quantize_scaled(name, (n, k), rng, 5.0) for _ in range(experts)])


def gguf_mixtral(
    folder: Path,
    *,
    seed: int = 11,
    experts: int = 4,
    top_k: int = 2,
    tied: bool = False,
    types: dict[str, tuple[str, ...]] | None = None,
) -> Path:
    """A 2-layer llama MoE GGUF as llama.cpp writes Mixtral: stacked ``blk.N.ffn_{gate,up,down}_exps``
    ``[E, N, K]`` in :data:`GGUF_EXPERT_TYPES`, an F32 router ``ffn_gate_inp``, Q4_0/Q8_0/Q4_1 GQA
    attention, a Q8_0 token embedding (tied, or a separate Q8_0 ``output.weight``), F32 norms.
    ``types``: the expert tensors' types per layer instead (classic types only split along K at tp 2)."""
    import gguf

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(MOE_INTER)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_expert_count(experts)
    w.add_expert_used_count(top_k)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q80 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", quantize_scaled("Q8_0", (VOCAB, HIDDEN), rng, 1.0), raw_dtype=q80)
    attention = {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "Q4_1"}
    shapes = linear_shapes(HIDDEN, MOE_INTER, KV_HEADS * head_dim, gguf=True)
    for layer in range(LAYERS):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for stem, name in attention.items():
            qtype = gguf.GGMLQuantizationType[name]
            data = quantize_scaled(name, shapes[stem], rng, 5.0)
            w.add_tensor(f"blk.{layer}.{stem}.weight", data, raw_dtype=qtype)
        router = (rng.standard_normal((experts, HIDDEN)) * 0.5).astype(np.float32)
        w.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", router)
        for stem, kinds in (types or GGUF_EXPERT_TYPES).items():
            name = kinds[layer % len(kinds)]
            n, k = shapes[stem.removesuffix("_exps")]
            data = _stacked(name, experts, n, k, rng)
            w.add_tensor(f"blk.{layer}.{stem}.weight", data, raw_dtype=gguf.GGMLQuantizationType[name])
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", quantize_scaled("Q8_0", (VOCAB, HIDDEN), rng, 1.0), raw_dtype=q80)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


# --- The acceptance matrix's checkpoints: SmolLM's hidden 576, splits that cross quantization groups ---


@dataclass(frozen=True)
class Shape:
    """A llama's dims for the matrix builders (head_dim = hidden / heads)."""

    hidden: int = 576
    heads: int = 12
    kv_heads: int = 6
    inter: int = 1536
    vocab: int = 1001
    layers: int = 2

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)


WIDE = Shape()
"""hidden 576 (SmolLM-135M's), 12 heads of 48 over 6 kv heads (GQA, groups of 2), intermediate 1536
(six 256-superblocks), odd vocab 1001. The planner splits it at tp 2, 3 and 4; see the matrix test's
module docstring for which splits land inside a group and are moved to group boundaries."""


def gguf_mix(folder: Path, shape: Shape = WIDE, *, seed: int = 11) -> Path:
    """:func:`gguf_tiny`'s mix (Q4_0/Q4_1/Q8_0 on K = hidden, Q4_K/Q6_K ``ffn_down``, tied Q8_0 token
    embedding, F32 norms) at ``shape``'s dims, as llama.cpp writes a llama GGUF."""
    import gguf

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    head_dim = shape.hidden // shape.heads
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(shape.layers)
    w.add_context_length(256)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.inter)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    q80 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor(
        "token_embd.weight", quantize_scaled("Q8_0", (shape.vocab, shape.hidden), rng, 1.0), raw_dtype=q80
    )
    for layer in range(shape.layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        for stem, dims in linear_shapes(shape.hidden, shape.inter, shape.kv_dim, gguf=True).items():
            kind = GGUF_TYPES[stem]
            name = kind[layer % len(kind)] if isinstance(kind, tuple) else str(kind)
            data = quantize_scaled(name, dims, rng, 5.0)
            w.add_tensor(f"blk.{layer}.{stem}.weight", data, raw_dtype=gguf.GGMLQuantizationType[name])
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def _minmax_with_tail(weight: np.ndarray, group: int) -> dict[str, Any]:
    """:func:`quantize_minmax` where K need not be a multiple of ``group``: the last group is partial."""
    k = weight.shape[1]
    padded = np.concatenate([weight, np.repeat(weight[:, -1:], -k % group, axis=1)], axis=1)
    case = quantize_minmax(padded, group)
    return {**case, "q": case["q"][:k], "g_idx": case["g_idx"][:k]}


def _ct_planes(weight: np.ndarray, group: int, prefix: str) -> dict[str, np.ndarray]:
    """compressed-tensors pack-quantized, int4 symmetric per group, by the package's own compressor."""
    import compressed_tensors.compressors.pack_quantized.base as pack
    import compressed_tensors.quantization as quantization
    import torch

    n, k = weight.shape
    args = quantization.QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=group
    )
    scheme = quantization.QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.from_numpy(weight)
    scale = (w.reshape(n, k // group, group).abs().amax(-1) / 7 + 1e-4).to(torch.float16)
    state = {"weight": w.to(torch.float16), "weight_scale": scale}
    compressed = pack.PackedQuantizationCompressor.compress(state, scheme)
    return {f"{prefix}.{leaf}": t.numpy() for leaf, t in compressed.items()}


QuantFormat = Literal["gptq", "awq", "compressed-tensors"]


def quantized_llama(
    folder: Path, fmt: QuantFormat, group: int, shape: Shape = WIDE, *, seed: int = 13
) -> Path:
    """A llama safetensors checkpoint at ``shape``'s dims, every linear 4-bit ``fmt`` with ``group``
    (GPTQ may leave a partial last group: 576 = 4.5 x 128), float16 embeddings, head and norms."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((shape.vocab, shape.hidden)).astype(np.float16),
        "lm_head.weight": (rng.standard_normal((shape.vocab, shape.hidden)) * 0.1).astype(np.float16),
        "model.norm.weight": np.ones(shape.hidden, dtype=np.float16),
    }
    for layer in range(shape.layers):
        for slot, (n, k) in linear_shapes(shape.hidden, shape.inter, shape.kv_dim).items():
            weight = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
            prefix = f"model.layers.{layer}.{slot}"
            if fmt == "compressed-tensors":
                tensors.update(_ct_planes(weight, group, prefix))
            elif fmt == "awq":
                tensors.update(awq_planes(quantize_minmax(weight, group), prefix))
            else:
                tensors.update(gptq_planes(_minmax_with_tail(weight, group), prefix))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = np.ones(shape.hidden, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    quant: dict[str, Any] = {
        "gptq": {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group,
            "desc_act": False,
            "checkpoint_format": "gptq",
        },
        "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"},
        "compressed-tensors": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": group,
                    },
                }
            },
        },
    }[fmt]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": shape.layers,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.inter,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "rms_norm_eps": 1e-5,
        "quantization_config": quant,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder
