"""An F8 plane (E4M3, E5M2) of a float checkpoint goes through push, ``pull --tp 2 --rank 0``, decode as F8.

The checkpoint is written by safetensors from torch's float8 tensors; the expected values are torch's
widening of the same F8 numbers to float32 (the product widens the bits itself, exactly, without torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from llama_artifacts import ok
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.torch import save_file

Q = "model.layers.0.self_attn.q_proj.weight"  # column parallel: rank 0 holds rows [0, N/2)
DOWN = "model.layers.0.mlp.down_proj.weight"  # row parallel: rank 0 holds columns [0, K/2)
F8 = {Q: "F8_E4M3", DOWN: "F8_E5M2"}
HIDDEN, INTER = 128, 256


def f8_llama(folder: Path) -> dict[str, torch.Tensor]:
    """A one-layer float16 llama whose q_proj is stored as E4M3 and down_proj as E5M2."""
    rng = np.random.default_rng(5)

    def f16(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float16))

    tensors = {
        "model.embed_tokens.weight": f16(64, HIDDEN),
        Q: f16(HIDDEN, HIDDEN).to(torch.float8_e4m3fn),
        "model.layers.0.self_attn.k_proj.weight": f16(32, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": f16(HIDDEN, HIDDEN),
        DOWN: (4 * f16(HIDDEN, INTER)).to(torch.float8_e5m2),
        "model.layers.0.mlp.up_proj.weight": f16(INTER, HIDDEN),
        "model.layers.0.input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.float32),
    }
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return tensors


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy()


def test_f8_planes_push_pull_rank_and_decode_as_f8(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    source = f8_llama(tmp_path / "ck")
    ok(store, "push", tmp_path / "ck", "m/f8:1")
    manifest = ok(store, "inspect", "m/f8:1")["manifest"]
    weights = {w["name"]: w["contract"] for w in manifest["weights"]}
    dtypes = {t["name"]: t["dtype"] for t in manifest["tensors"]}
    for name, dtype in F8.items():
        assert dtypes[name] == dtype
        assert weights[name]["family"] == "float" and weights[name]["physical_dtype"] == dtype
        assert weights[name]["format"] == dtype[3:].lower()  # e4m3 / e5m2

    res = ok(store, "pull", "m/f8:1", tmp_path / "r", "--tp", "2", "--rank", "0")
    with safe_open(res["out"], "numpy") as f:
        meta = f.metadata()
        got = {name: f.get_tensor(name) for name in F8}
    want = {Q: bits(source[Q])[: HIDDEN // 2], DOWN: bits(source[DOWN])[:, : INTER // 2]}
    for name, dtype in F8.items():
        piece = json.loads(meta[f"shardport.slice.{name}"])
        assert piece["dtype"] == dtype and piece["shape"] == list(want[name].shape)
        # the F8 bytes as they are (viewed as their raw bits, as BF16 is), not re-blocked like a GGUF type
        assert got[name].dtype == np.uint8 and got[name].shape == want[name].shape
        assert np.array_equal(got[name], want[name])

    for name in F8:
        out = tmp_path / f"{name}.safetensors"
        res = ok(store, "decode", "m/f8:1", name, "--out", out)
        assert res["family"] == "float" and res["dtype"] == "F32"
        decoded = load_file(str(out))[name]
        expected = source[name].to(torch.float32).numpy()
        assert expected.dtype == decoded.dtype == np.float32 and np.isfinite(expected).all()
        assert np.array_equal(decoded, expected)
        assert len(np.unique(expected)) > 20  # many distinct F8 numbers, not a constant
