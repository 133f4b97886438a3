"""GGUF tensors and checkpoints of every type ``gguf.quants`` dequantizes.

Data come from ``gguf.quants.quantize`` where gguf has a quantizer for the type (F32/F16/BF16, the
classic 32-blocks, TQ1_0, TQ2_0, MXFP4); for the others, valid random blocks: random bytes with every
scale field written as one a quantizer could produce (finite binary16 d/dmin, MXFP4 e8m0 exponents
near 127, NVFP4 unsigned-e4m3 bytes below 0x7F). The scale offsets here are written from the block
layouts independently of the decoders under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType
from gguf.quants import dequantize, quantize

#: binary16 scale fields (byte offsets in a block) of the block types without a gguf quantizer.
HALF_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "IQ4_XS": (0,),
    "IQ4_NL": (0,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}


def dequantizable() -> list[str]:
    """Every ggml type name ``gguf.quants.dequantize`` decodes (tried on one zero block)."""
    names = []
    for qtype in GGMLQuantizationType:
        if qtype not in GGML_QUANT_SIZES:
            continue
        _, type_size = GGML_QUANT_SIZES[qtype]
        try:
            dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        names.append(qtype.name)
    return names


def _halves(rng: np.random.Generator, count: int) -> np.ndarray:
    return (rng.standard_normal(count) * 0.02).astype("<f2")


def random_blocks(name: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """``[rows, row_bytes]`` uint8 of valid random ``name`` blocks (finite scale fields)."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    count = rows * (columns // block)
    raw = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    for offset in HALF_FIELDS.get(name, ()):
        raw[:, offset : offset + 2] = _halves(rng, count).view(np.uint8).reshape(count, 2)
    if name == "IQ1_M":  # d is the top nibbles of the four u16 scale words at 48
        words = raw[:, 48:56].copy().view("<u2").astype(np.int64) & 0x0FFF
        d = _halves(rng, count).view("<u2").astype(np.int64)
        for k in range(4):
            words[:, k] |= ((d >> (4 * k)) & 0xF) << 12
        raw[:, 48:56] = words.astype("<u2").view(np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(118, 130, size=count)
    if name == "NVFP4":
        raw[:, 0:4] = rng.integers(0x30, 0x50, size=(count, 4))
    return raw.reshape(rows, -1)


def tensor_data(name: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """What ``GGUFWriter.add_tensor`` takes for a ``name`` tensor of logical ``shape``."""
    values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    if name == "F32":
        return values
    if name == "F16":
        return values.astype(np.float16)
    try:
        return quantize(values, GGMLQuantizationType[name])
    except NotImplementedError:
        return random_blocks(name, *shape, rng)


#: One llama slot per type gguf dequantizes beyond the classic ones (token_embd and output included),
#: so one push / pull / rank-pull cycle covers them all; attn_output and ffn_down are split along K.
MIXED_TYPES: dict[str, str] = {
    "token_embd": "Q2_K",
    "blk.0.attn_q": "Q3_K",
    "blk.0.attn_k": "IQ4_XS",
    "blk.0.attn_v": "IQ4_NL",
    "blk.0.attn_output": "TQ2_0",
    "blk.0.ffn_gate": "MXFP4",
    "blk.0.ffn_up": "NVFP4",
    "blk.0.ffn_down": "TQ1_0",
    "blk.1.attn_q": "IQ1_S",
    "blk.1.attn_k": "IQ1_M",
    "blk.1.attn_v": "IQ2_XXS",
    "blk.1.attn_output": "IQ2_XS",
    "blk.1.ffn_gate": "IQ2_S",
    "blk.1.ffn_up": "IQ3_XXS",
    "blk.1.ffn_down": "IQ3_S",
    "output": "Q2_K",
}
HIDDEN, INTER, VOCAB, HEADS = 512, 512, 64, 8


def mixed_gguf(
    folder: Path, *, quantization_version: int | None = GGML_QUANT_VERSION
) -> dict[str, np.ndarray]:
    """A 2-layer llama GGUF whose linears are :data:`MIXED_TYPES` (hidden 512, 8 heads), with a small
    tokenizer in its header; returns each quantized weight's ``gguf.quants.dequantize`` decode."""
    import gguf

    rng = np.random.default_rng(17)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(2)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_vocab_size(VOCAB)
    if quantization_version is not None:
        w.add_quantization_version(quantization_version)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(VOCAB)])
    w.add_token_scores([float(-i) for i in range(VOCAB)])
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN, HIDDEN), "attn_v": (HIDDEN, HIDDEN)}
    shapes |= {"attn_output": (HIDDEN, HIDDEN), "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN)}
    shapes |= {"ffn_down": (HIDDEN, INTER), "token_embd": (VOCAB, HIDDEN), "output": (VOCAB, HIDDEN)}
    expected: dict[str, np.ndarray] = {}
    for stem, name in MIXED_TYPES.items():
        qtype = GGMLQuantizationType[name]
        data = tensor_data(name, shapes[stem.rsplit(".", 1)[-1]], rng)
        w.add_tensor(f"{stem}.weight", data, raw_dtype=qtype)
        expected[f"{stem}.weight"] = dequantize(data, qtype).astype(np.float32)
        if stem.endswith("attn_v"):
            layer = stem.split(".")[1]
            for norm in ("attn_norm", "ffn_norm"):
                w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected
