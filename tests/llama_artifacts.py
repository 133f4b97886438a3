"""Llama-shaped quantized checkpoints (GPTQ safetensors, GGUF Q4_1) and rank-pull helpers for tests."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from quantized import gptq_planes, quantize_minmax
from safetensors import safe_open
from safetensors.numpy import save_file

from shardport.cli import main
from shardport.registry.artifact.manifest import Manifest

HIDDEN, INTER, LAYERS, HEADS = 1024, 2048, 2, 8
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "checkpoint_format": "gptq"}


def linear_shapes(hidden: int, inter: int, kv_dim: int, *, gguf: bool = False) -> dict[str, tuple[int, int]]:
    """A llama layer's linear weights ``[N, K]`` by slot: Hugging Face names, or GGUF's (``gguf``)."""
    hf = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (kv_dim, hidden),
        "self_attn.v_proj": (kv_dim, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    if not gguf:
        return hf
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    return dict(zip(names, hf.values(), strict=True))


def cli(store: str, *args: str | Path) -> tuple[int, dict[str, Any]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["--store", store, "--json", *map(str, args)])
    return code, json.loads(buf.getvalue())


def ok(store: str, *args: str | Path) -> dict[str, Any]:
    code, out = cli(store, *args)
    assert code == 0, out
    return out


def gptq_llama(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((256, HIDDEN)).astype(np.float16),
        "lm_head.weight": rng.standard_normal((256, HIDDEN)).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, dtype=np.float16),
    }
    shapes = linear_shapes(HIDDEN, INTER, HIDDEN)
    for layer in range(LAYERS):
        for slot, (n, k) in shapes.items():
            case = quantize_minmax(rng.standard_normal((n, k)).astype(np.float32), 128)
            tensors.update(gptq_planes(case, f"model.layers.{layer}.{slot}"))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = np.ones(HIDDEN, dtype=np.float16)
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": LAYERS,
                "hidden_size": HIDDEN,
                "intermediate_size": INTER,
                "num_attention_heads": HEADS,
                "num_key_value_heads": HEADS,
                "vocab_size": 256,
                "quantization_config": GPTQ,
            }
        )
    )
    return folder


def gguf_llama(folder: Path) -> Path:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    q41 = gguf.GGMLQuantizationType.Q4_1
    shapes = {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (HIDDEN, HIDDEN),
        "attn_v": (HIDDEN, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INTER, HIDDEN),
        "ffn_up": (INTER, HIDDEN),
        "ffn_down": (HIDDEN, INTER),
    }
    w.add_tensor(
        "token_embd.weight",
        quantize(rng.standard_normal((256, HIDDEN)).astype(np.float32), q41),
        raw_dtype=q41,
    )
    for layer in range(LAYERS):
        for stem, shape in shapes.items():
            data = quantize(rng.standard_normal(shape).astype(np.float32), q41)
            w.add_tensor(f"blk.{layer}.{stem}.weight", data, raw_dtype=q41)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor(
        "output.weight", quantize(rng.standard_normal((256, HIDDEN)).astype(np.float32), q41), raw_dtype=q41
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def reassemble(manifest: Manifest, src: Path, outs: list[Path]) -> None:
    """Put every rank's slices back; each tensor must come out byte-identical to the source."""
    entries = {e.name: e for e in manifest.tensors or []}
    images = {n: np.zeros(e.end - e.start, dtype=np.uint8) for n, e in entries.items()}
    covered = {n: np.zeros(e.end - e.start, dtype=bool) for n, e in entries.items()}
    for out in outs:
        with safe_open(str(out), "numpy") as f:
            meta = f.metadata()
            for name in f.keys():
                info = json.loads(meta[f"shardport.slice.{name}"])
                tensor = name.split("@")[0]
                e = entries[tensor]
                data = f.get_tensor(name).view(np.uint8).reshape(-1)
                rows = e.shape[0] if len(e.shape) > 1 else 1
                row_bytes = (e.end - e.start) // rows
                index = info["index"]
                if len(e.shape) > 1:
                    (r0, r1), (c0, c1) = index[0], index[1]
                    block = data.reshape(r1 - r0, -1)
                    view = images[tensor].reshape(rows, row_bytes)
                    cov = covered[tensor].reshape(rows, row_bytes)
                    first = c0 * row_bytes // e.shape[1]  # GGUF: elements -> whole blocks of bytes
                    cols = slice(first, first + block.shape[1])
                    view[r0:r1, cols] = block
                    cov[r0:r1, cols] = True
                else:
                    (c0, c1) = index[0]
                    per = (e.end - e.start) // e.shape[0]
                    images[tensor][c0 * per : c1 * per] = data
                    covered[tensor][c0 * per : c1 * per] = True
    for name, e in entries.items():
        source = np.fromfile(src / e.file, dtype=np.uint8, count=e.end - e.start, offset=e.start)
        assert covered[name].all(), name
        assert np.array_equal(images[name], source), name


SMOL = {"hidden": 576, "heads": 9, "kv_heads": 3, "inter": 1536, "vocab": 49152, "layers": 30}
"""A 135M-parameter llama (SmolLM-135M's dims): head_dim 64, tied embeddings."""


def gguf_smollm(
    folder: Path,
    layers: int = 2,
    *,
    vocab: int = SMOL["vocab"],
    heads: int = SMOL["heads"],
    kv_heads: int = SMOL["kv_heads"],
    extra: Callable[[Any], None] | None = None,
) -> Path:
    """A GGUF at SmolLM-135M's dims as llama.cpp writes it: Q4_1 linears, a tied Q8_0 token embedding
    (no ``output.weight``), F32 norms, llama metadata keys; ``layers`` blocks (the real model has 30).
    ``heads`` / ``kv_heads`` change the attention layout only (head_dim = hidden / heads; hidden,
    intermediate, vocab and quant types stay), e.g. 12 / 4 for a model the planner splits at tp 4 and 8.
    ``extra``: called with the ``GGUFWriter`` before the tensors, to add keys (e.g. a tokenizer)."""
    import gguf
    from gguf.quants import quantize

    hidden, inter = SMOL["hidden"], SMOL["inter"]
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden {hidden} must divide into {heads} heads, in groups of {kv_heads} kv heads")
    head_dim = hidden // heads
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_name("SmolLM 135M")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_vocab_size(vocab)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if extra is not None:
        extra(w)
    q41, q80 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0

    def weight(shape: tuple[int, int], qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        return quantize((rng.standard_normal(shape) * 0.02).astype(np.float32), qtype)

    w.add_tensor("token_embd.weight", weight((vocab, hidden), q80), raw_dtype=q80)
    shapes = linear_shapes(hidden, inter, kv_heads * head_dim, gguf=True)
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        for stem, shape in shapes.items():
            w.add_tensor(f"blk.{layer}.{stem}.weight", weight(shape, q41), raw_dtype=q41)
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder


def sharded_float(folder: Path) -> Path:
    """A small float checkpoint with an index whose total_size is the file sizes (a note rides along)."""
    rng = np.random.default_rng(11)
    shards = {
        "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": rng.standard_normal((64, 32))},
        "model-00002-of-00002.safetensors": {"lm_head.weight": rng.standard_normal((64, 32))},
    }
    folder.mkdir(parents=True)
    for file, tensors in shards.items():
        save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(folder / file))
    index = {
        "metadata": {"total_size": sum((folder / f).stat().st_size for f in shards)},
        "weight_map": {t: f for f, ts in shards.items() for t in ts},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 32})
    )
    return folder
