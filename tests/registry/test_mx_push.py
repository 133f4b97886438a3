"""MXFP4 / NVFP4 and act-order permutation planes through the registry: push, inspect, decode, pull,
``pull --tp 2 --rank R`` (blocks never cut) and verify.

The FP4 checkpoints are written by compressed-tensors' own compressors; decodes are compared bit for bit
with its decompressor.
"""

from __future__ import annotations

import json
from pathlib import Path

import grit
import numpy as np
import pytest
import torch
from llama_artifacts import cli, ok
from mx_checkpoints import compress, config, decompress
from quantized import expected_decode, make_quantized, pack_along_columns, pack_along_rows
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

Q = "model.layers.0.self_attn.q_proj"  # column parallel: rank r holds rows [r*N/2, (r+1)*N/2)
DOWN = "model.layers.0.mlp.down_proj"  # row parallel: rank r holds columns [r*K/2, (r+1)*K/2)
HIDDEN, INTER = 128, 256
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 1,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}


def fp4_llama(folder: Path, kind: str) -> dict[str, dict[str, torch.Tensor]]:
    """A one-layer llama whose q_proj and down_proj are ``kind`` (compressed-tensors), the rest fp16."""
    generator = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    quantized = {
        Q: compress(kind, randn(HIDDEN, HIDDEN).to(torch.bfloat16)),
        DOWN: compress(kind, randn(HIDDEN, INTER).to(torch.bfloat16)),
    }
    tensors = {f"{module}.{leaf}": t for module, planes in quantized.items() for leaf, t in planes.items()}
    tensors |= {
        "model.embed_tokens.weight": randn(64, HIDDEN).half(),
        "model.layers.0.self_attn.k_proj.weight": randn(32, HIDDEN).half(),
        "model.layers.0.self_attn.o_proj.weight": randn(HIDDEN, HIDDEN).half(),
        "model.layers.0.mlp.up_proj.weight": randn(INTER, HIDDEN).half(),
        "model.layers.0.input_layernorm.weight": torch.ones(HIDDEN),
    }
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(LLAMA | config(kind)))
    return quantized


def _raw(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).numpy()


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_fp4_push_inspect_decode_pull_rank_verify(kind: str, tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    quantized = fp4_llama(tmp_path / "ck", kind)
    # small tiles, so that the planes are cut and the cuts must fall on whole blocks
    ok(store, "push", tmp_path / "ck", "m/fp4:1", "--tile-min", "256", "--tile-size", "2048")
    manifest = ok(store, "inspect", "m/fp4:1")["manifest"]
    contracts = {w["name"]: w["contract"] for w in manifest["weights"]}
    for module in (Q, DOWN):
        contract = contracts[f"{module}.weight"]
        assert contract["family"] == "mx_block" and contract["scheme"] == kind
        assert contract["label"]["evidence"][0].endswith("quant_method=compressed-tensors")
        grade = contract["grit"]
        assert grade["grade"] == grit.GRADE_MXFP4 if kind == "mxfp4" else "divided" in grade["why"]
        out = tmp_path / f"{module}.safetensors"
        ok(store, "decode", "m/fp4:1", f"{module}.weight", "--out", out)
        decoded = load_file(str(out))[f"{module}.weight"]
        reference = decompress(kind, quantized[module])
        assert np.array_equal(decoded.view(np.uint32), reference.view(np.uint32))

    ok(store, "pull", "m/fp4:1", tmp_path / "full")
    assert ok(store, "verify", tmp_path / "full")["ok"]

    groups = {"nvfp4": 16, "mxfp4": 32}[kind]
    for rank in (0, 1):
        res = ok(store, "pull", "m/fp4:1", tmp_path / f"r{rank}", "--tp", "2", "--rank", str(rank))
        ledger = res["ledger"]
        assert ledger["witness_weights_unchecked"] == 0 and ledger["witness_weights_checked"] > 0
        assert res["read_amplification"] <= 1.05  # the tile cuts fall on the blocks' split points
        with safe_open(res["out"], "numpy") as f:
            got = {name: f.get_tensor(name) for name in f.keys()}
        rows = slice(rank * HIDDEN // 2, (rank + 1) * HIDDEN // 2)
        half_k = INTER // 2  # whole blocks: INTER/2 is a multiple of the block size
        assert half_k % groups == 0
        cols = slice(rank * half_k // 2, (rank + 1) * half_k // 2)  # two codes per byte
        blocks = slice(rank * half_k // groups, (rank + 1) * half_k // groups)
        q, down = quantized[Q], quantized[DOWN]
        assert np.array_equal(got[f"{Q}.weight_packed"], _raw(q["weight_packed"])[rows])
        assert np.array_equal(got[f"{Q}.weight_scale"], _raw(q["weight_scale"])[rows])
        assert np.array_equal(got[f"{DOWN}.weight_packed"], _raw(down["weight_packed"])[:, cols])
        assert np.array_equal(got[f"{DOWN}.weight_scale"], _raw(down["weight_scale"])[:, blocks])
        if kind == "nvfp4":  # the per-tensor scale goes whole to every rank
            assert np.array_equal(got[f"{DOWN}.weight_global_scale"], _raw(down["weight_global_scale"]))


def test_fp4_hostile_global_scale_refused_at_push(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    fp4_llama(tmp_path / "ck", "nvfp4")
    path = str(tmp_path / "ck" / "model.safetensors")
    with safe_open(path, "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    tensors[f"{DOWN}.weight_global_scale"] = torch.tensor([float("inf")])
    save_file(tensors, path)
    code, out = cli(store, "push", tmp_path / "ck", "m/fp4:1")
    assert code == 5 and out["error"]["type"] == "GlobalScaleError", out
    assert f"{DOWN}.weight_global_scale" in out["error"]["message"]
    assert cli(store, "ls")[1] == []  # nothing was tagged


PERM_PREFIX = "model.layers.0.mlp.down_proj"


def act_order_gptq(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """An act-order GPTQ weight stored in group order with a ``perm`` plane (stored → logical).

    Returns the logical decode and the permutation.
    """
    case = make_quantized(n=64, k=128, group_size=32, act_order=True, seed=3)
    logical = expected_decode(case["q"], case["zeros"], case["scales"], case["g_idx"])
    perm = np.argsort(case["g_idx"], kind="stable").astype(np.int32)  # stored s holds logical perm[s]
    planes = {
        f"{PERM_PREFIX}.qweight": pack_along_rows(case["q"][perm], 4),
        f"{PERM_PREFIX}.qzeros": pack_along_columns(case["zeros"] - 1, 4),
        f"{PERM_PREFIX}.scales": case["scales"],
        f"{PERM_PREFIX}.g_idx": case["g_idx"][perm],
        f"{PERM_PREFIX}.perm": perm,
        "model.norm.weight": np.ones(64, dtype=np.float16),
    }
    folder.mkdir()
    save_numpy({k: np.ascontiguousarray(v) for k, v in planes.items()}, str(folder / "model.safetensors"))
    gptq = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "desc_act": True,
        "checkpoint_format": "gptq",
    }
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "quantization_config": gptq}
    (folder / "config.json").write_text(json.dumps(cfg))
    return logical, perm


def _perm_declaration(direction: str) -> str:
    plane = {
        "kind": "plane",
        "plane": f"{PERM_PREFIX}.perm",
        "physical_dtype": "I32",
        "physical_shape": [128],
        "axis": "K",
        "direction": direction,
    }
    return json.dumps({"weights": {f"{PERM_PREFIX}.weight": {"permutation": plane}}})


def test_act_order_perm_plane_round_trips(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    logical, perm = act_order_gptq(tmp_path / "ck")
    code, out = cli(store, "push", tmp_path / "ck", "m/perm:1")  # the direction is never guessed
    assert code == 5 and out["error"]["type"] == "ContractAmbiguousError", out
    assert "direction" in out["error"]["message"] and "stored_to_logical" in out["error"]["message"]

    ok(store, "push", tmp_path / "ck", "m/perm:1", "--declare", _perm_declaration("stored_to_logical"))
    weights = {w["name"]: w for w in ok(store, "inspect", "m/perm:1")["manifest"]["weights"]}
    contract = weights[f"{PERM_PREFIX}.weight"]["contract"]
    assert contract["permutation"]["direction"] == "stored_to_logical"
    assert contract["label"]["kind"] == "declared" and not contract["grit"]["expressible"]
    ok(store, "decode", "m/perm:1", f"{PERM_PREFIX}.weight", "--out", tmp_path / "d.safetensors")
    assert np.array_equal(load_file(str(tmp_path / "d.safetensors"))[f"{PERM_PREFIX}.weight"], logical)
    ok(store, "pull", "m/perm:1", tmp_path / "pulled")
    assert ok(store, "verify", tmp_path / "pulled")["ok"]
    ok(store, "decode", tmp_path / "pulled", f"{PERM_PREFIX}.weight", "--out", tmp_path / "p.safetensors")
    assert np.array_equal(load_file(str(tmp_path / "p.safetensors"))[f"{PERM_PREFIX}.weight"], logical)

    # the other direction reads the plane as its inverse: another weight (perm is no involution)
    ok(store, "push", tmp_path / "ck", "m/perm:2", "--declare", _perm_declaration("logical_to_stored"))
    ok(store, "decode", "m/perm:2", f"{PERM_PREFIX}.weight", "--out", tmp_path / "w.safetensors")
    wrong = load_file(str(tmp_path / "w.safetensors"))[f"{PERM_PREFIX}.weight"]
    assert not np.array_equal(perm[perm], np.arange(128)) and not np.array_equal(wrong, logical)

    bad = perm.copy()
    bad[0] = bad[1]
    planes = load_file(str(tmp_path / "ck" / "model.safetensors"))
    save_numpy({**planes, f"{PERM_PREFIX}.perm": bad}, str(tmp_path / "ck" / "model.safetensors"))
    code, out = cli(
        store, "push", tmp_path / "ck", "m/perm:3", "--declare", _perm_declaration("stored_to_logical")
    )
    assert code == 5 and out["error"]["type"] == "PermutationError", out
    assert "bijection" in out["error"]["message"] and "repeated" in out["error"]["message"]


def test_act_order_perm_plane_pushes_against_a_logical_order_reference(tmp_path: Path, home: Path) -> None:
    """``--reference`` holds the float weight in logical order; the decode is compared in that order."""
    store = str(tmp_path / "store")
    ok(store, "keygen")
    logical, perm = act_order_gptq(tmp_path / "ck")
    declare = _perm_declaration("stored_to_logical")
    weight = f"{PERM_PREFIX}.weight"
    for name, values in (("ref", logical), ("stored", logical[:, perm])):
        (tmp_path / name).mkdir()
        save_numpy(
            {weight: np.ascontiguousarray(values, dtype=np.float32)}, str(tmp_path / name / "w.safetensors")
        )

    ok(store, "push", tmp_path / "ck", "m/perm:1", "--declare", declare, "--reference", tmp_path / "ref")
    manifest = ok(store, "inspect", "m/perm:1")["manifest"]
    weights = {w["name"]: w for w in manifest["weights"]}
    assert weights[weight]["witness"]["rel_error"] == 0.0  # the reference is the exact decode
    measured = manifest["quantization"]["quant_error"][weight]
    assert measured["e_quant"] == measured["max_abs"] == 0.0 < measured["tolerance"]

    # the same values in stored order are another weight: refused, naming it
    code, out = cli(
        store, "push", tmp_path / "ck", "m/perm:2", "--declare", declare, "--reference", tmp_path / "stored"
    )
    assert code == 5 and out["error"]["type"] == "ReferenceErrorTooLargeError", out
    assert weight in out["error"]["message"]
    assert [t["name"] for t in cli(store, "ls")[1]] == ["m/perm"]
