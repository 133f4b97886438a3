"""Contracts through the registry: push gates and infers, pull and verify re-check, decode writes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quantized import expected_decode, gptq_planes, make_quantized, quantize_minmax
from safetensors.numpy import load_file, save_file
from support import Cli

from shardport.provenance import dsse
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.session import Session
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, manifest_statement
from shardport.registry.trust.tagging import move_tag

PREFIX = "model.layers.0.mlp.down_proj"
WEIGHT = f"{PREFIX}.weight"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "checkpoint_format": "gptq"}


def gptq_checkpoint(
    folder: Path, *, config: dict[str, Any] | None = None, original: np.ndarray | None = None
) -> np.ndarray:
    """A tiny GPTQ checkpoint (of ``original`` when given); returns the exact weight its planes encode."""
    if original is None:
        case = make_quantized(n=64, k=128, group_size=32)
    else:
        case = quantize_minmax(original, 32)
    planes = gptq_planes(case, PREFIX)
    planes["model.norm.weight"] = np.ones(64, dtype=np.float16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in planes.items()}, str(folder / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}
    if config is not None:
        cfg.update(config)
    (folder / "config.json").write_text(json.dumps(cfg))
    return expected_decode(case["q"], case["zeros"], case["scales"], np.arange(128) // 32)


def reference_checkpoint(folder: Path, weight: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({WEIGHT: np.ascontiguousarray(weight.astype(np.float32))}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def original() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((64, 128)).astype(np.float32)


def test_push_records_contracts_and_witnesses(cli: Cli, tmp_path: Path) -> None:
    exact = gptq_checkpoint(tmp_path / "q", config={"quantization_config": GPTQ}, original=original())
    ref = reference_checkpoint(tmp_path / "ref", original())
    out = cli.ok("push", tmp_path / "q", "acme/q:v1", "--reference", ref)
    info = cli.ok("inspect", "acme/q:v1")
    m = info["manifest"]
    assert m["container"]["kind"] == "safetensors" and m["quantization"]["family"] == "gptq"
    weights = {w["name"]: w for w in m["weights"]}
    q = weights[WEIGHT]
    assert q["contract"]["family"] == "affine_int"
    assert q["contract"]["label"]["kind"] == "inferred"
    assert "quant_method=gptq" in q["contract"]["label"]["evidence"][0]
    assert q["contract"]["zero_point"]["convention"] == "minus_one"
    assert q["binding"]["slot"] == "mlp.down_proj" and q["binding"]["layer"] == 0
    assert 0.01 < q["witness"]["rel_error"] < 0.12 and q["witness"]["kind"] == "cells"  # honest 4-bit
    measured = m["quantization"]["quant_error"][WEIGHT]  # E_quant, apart from any kernel's error
    assert measured["rel_frobenius"] == pytest.approx(q["witness"]["rel_error"], rel=1e-5)
    assert 0.01 < measured["e_quant"] < measured["tolerance"] and measured["clipped"] == 0
    assert info["e_quant"] == {
        "weights": 1,
        "max": measured["e_quant"],
        "weight": WEIGHT,
        "over_tolerance": [],
    }
    roles = {t["name"]: t["role"] for t in m["tensors"]}
    assert roles[f"{PREFIX}.qweight"] == "codes" and roles[f"{PREFIX}.scales"] == "scale"
    assert weights["model.norm.weight"]["contract"]["family"] == "float"

    cli.ok("decode", "acme/q:v1", WEIGHT, "--out", tmp_path / "d.safetensors")
    decoded = load_file(str(tmp_path / "d.safetensors"))
    assert list(decoded) == [WEIGHT] and decoded[WEIGHT].dtype == np.float32
    assert np.array_equal(decoded[WEIGHT], exact)
    pulled = cli.ok("pull", "acme/q:v1", tmp_path / "pulled")
    assert pulled["digest"] == out["digest"]
    report = cli.ok("verify", tmp_path / "pulled")
    assert report["weights_checked"] == 2
    cli.ok("decode", tmp_path / "pulled", f"{PREFIX}.qweight", "--out", tmp_path / "d2.safetensors")
    assert np.array_equal(load_file(str(tmp_path / "d2.safetensors"))[f"{PREFIX}.qweight"], exact)
    cli.ok("decode", tmp_path / "q" / "model.safetensors", WEIGHT, "--out", tmp_path / "d3.safetensors")
    assert np.array_equal(load_file(str(tmp_path / "d3.safetensors"))[WEIGHT], exact)


def test_convention_mislabel_is_refused_against_the_reference(cli: Cli, tmp_path: Path) -> None:
    as_is = {"quantization_config": {**GPTQ, "checkpoint_format": "gptq_v2"}}  # the wrong convention
    gptq_checkpoint(tmp_path / "q", config=as_is, original=original())
    ref = reference_checkpoint(tmp_path / "ref", original())
    code, out = cli("push", tmp_path / "q", "acme/q:bad", "--reference", ref)
    assert code == 5 and out["error"]["type"] == "ReferenceErrorTooLargeError", out
    assert WEIGHT in out["error"]["message"]
    code, out = cli("ls")
    assert out == []  # nothing was tagged


def test_unknown_convention_needs_a_declaration(cli: Cli, tmp_path: Path) -> None:
    gptq_checkpoint(tmp_path / "q")
    code, out = cli("push", tmp_path / "q", "acme/q:v1")
    assert code == 5 and out["error"]["type"] == "ContractAmbiguousError", out
    assert "declare" in out["error"]["message"]
    spec = tmp_path / "declare.json"
    spec.write_text(json.dumps({"quantization": GPTQ}))
    cli.ok("push", tmp_path / "q", "acme/q:v1", "--declare", spec)
    info = cli.ok("inspect", "acme/q:v1")
    weights = {w["name"]: w for w in info["manifest"]["weights"]}
    assert weights[WEIGHT]["contract"]["label"]["kind"] == "declared"
    assert "quant_error" not in info["manifest"]["quantization"] and "e_quant" not in info  # no --reference


def test_hostile_container_refused_at_push_and_verify(cli: Cli, tmp_path: Path) -> None:
    gptq_checkpoint(tmp_path / "q", config={"quantization_config": GPTQ})
    f = tmp_path / "q" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])  # truncated: the last tensor's interval leaves the file
    code, out = cli("push", tmp_path / "q", "acme/q:v1")
    assert code == 5 and "model.safetensors" in out["error"]["message"], out
    code, report = cli("verify", tmp_path / "q")
    assert code == 5 and report["findings"] and not report["ok"]
    code, report = cli("verify", f)
    assert code == 5


def test_verify_checkpoint_clean_and_semantic_violation(cli: Cli, tmp_path: Path) -> None:
    gptq_checkpoint(tmp_path / "q", config={"quantization_config": GPTQ})
    report = cli.ok("verify", tmp_path / "q")
    assert report["ok"] and report["weights_checked"] == 2
    planes = load_file(str(tmp_path / "q" / "model.safetensors"))
    planes[f"{PREFIX}.scales"] = -planes[f"{PREFIX}.scales"]  # signed scales where positive is declared
    save_file(planes, str(tmp_path / "q" / "model.safetensors"))
    code, report = cli("verify", tmp_path / "q")
    assert code == 5 and report["findings"][0]["kind"] == "ScaleSignError", report


def test_pull_refuses_bytes_that_contradict_the_signed_witness(cli: Cli, tmp_path: Path) -> None:
    gptq_checkpoint(tmp_path / "q", config={"quantization_config": GPTQ})
    out = cli.ok("push", tmp_path / "q", "acme/q:v1")
    session = Session.open(cli.store)
    doc = json.loads(session.store.read_blob(out["digest"]))
    w = next(w for w in doc["weights"] if w["name"] == WEIGHT)
    raw = base64.b64decode(w["witness"]["digests"])
    # a producer bug: the witness of other cells
    w["witness"]["digests"] = base64.b64encode(raw[8:] + raw[:8]).decode()
    forged = Manifest.model_validate(doc)
    digest = session.store.put_blob(forged.to_bytes())
    assert session.key is not None
    env = dsse.sign(PAYLOAD_TYPE, manifest_statement("acme/q", digest).to_bytes(), [session.key])
    attach(session, "acme/q", digest, session.store.put_blob(env.to_bytes()), SIGNATURE_ARTIFACT)
    move_tag(session, "acme/q", "v1", digest)
    code, res = cli("pull", "acme/q:v1", tmp_path / "dest")
    assert code == 1 and res["error"]["type"] == "WitnessMismatchError", res
    assert not (tmp_path / "dest").exists()


def test_gguf_push_and_decode_matches_gguf_package(cli: Cli, tmp_path: Path) -> None:
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    folder = tmp_path / "g"
    folder.mkdir()
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    data = {}
    for name, qtype in [
        ("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.Q4_1),
        ("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q8_0),
    ]:
        w = rng.standard_normal((16, 64)).astype(np.float32)
        q = quantize(w, qtype)
        writer.add_tensor(name, q, raw_dtype=qtype)
        data[name] = dequantize(q, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cli.ok("push", folder, "acme/g:v1")
    for name, expected in data.items():
        cli.ok("decode", "acme/g:v1", name, "--out", tmp_path / "o.safetensors")
        got = load_file(str(tmp_path / "o.safetensors"))[name]
        assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))
    cli.ok("pull", "acme/g:v1", tmp_path / "gp")
    assert cli.ok("verify", tmp_path / "gp")["weights_checked"] == 2


def llama_checkpoint(folder: Path, *, layers: int = 2, tie: bool = False, extra: bool = False) -> Path:
    rng = np.random.default_rng(3)
    h, inter, vocab = 16, 32, 48
    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, h)),
        "model.norm.weight": np.ones(h),
    }
    if not tie:
        t["lm_head.weight"] = rng.standard_normal((vocab, h))
    else:
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1.0  # claims tied, is not
    for i in range(layers):
        p = f"model.layers.{i}."
        for slot, shape in [
            ("self_attn.q_proj", (h, h)),
            ("self_attn.k_proj", (h, h)),
            ("self_attn.v_proj", (h, h)),
            ("self_attn.o_proj", (h, h)),
            ("mlp.gate_proj", (inter, h)),
            ("mlp.up_proj", (inter, h)),
            ("mlp.down_proj", (h, inter)),
        ]:
            t[p + slot + ".weight"] = rng.standard_normal(shape)
        t[p + "input_layernorm.weight"] = np.ones(h)
        t[p + "post_attention_layernorm.weight"] = np.ones(h)
    if extra:
        t["model.layers.0.mystery.weight"] = np.ones((2, 2))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in t.items()},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": layers,
                "hidden_size": h,
                "tie_word_embeddings": tie,
            }
        )
    )
    return folder


def test_strict_inventory(cli: Cli, tmp_path: Path) -> None:
    good = llama_checkpoint(tmp_path / "good")
    report = cli.ok("verify", good, "--strict")
    assert report["notes"] == ["LlamaForCausalLM: 21 operator slots present"]
    cli.ok("push", good, "acme/l:v1", "--strict")

    extra = llama_checkpoint(tmp_path / "extra", extra=True)
    code, report = cli("verify", extra, "--strict")
    assert code == 5 and report["findings"][0]["kind"] == "InventoryMismatchError"
    assert "unexpected" in report["findings"][0]["message"]
    assert cli.ok("verify", extra)["ok"]  # not strict: noted only

    missing = llama_checkpoint(tmp_path / "missing", layers=2)
    cfg = json.loads((missing / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (missing / "config.json").write_text(json.dumps(cfg))
    code, out = cli("push", missing, "acme/l:v2", "--strict")
    assert code == 5 and out["error"]["type"] == "InventoryMismatchError"
    assert "missing" in out["error"]["message"]


def test_tied_embeddings_must_be_identical(cli: Cli, tmp_path: Path) -> None:
    bad = llama_checkpoint(tmp_path / "tied", tie=True)
    code, out = cli("push", bad, "acme/t:v1")
    assert code == 5 and out["error"]["type"] == "TiedAliasError", out
    assert "lm_head.weight" in out["error"]["message"]


def test_gguf_without_an_output_head_is_tied(cli: Cli, tmp_path: Path) -> None:
    """GGUF has no tie key: no ``output.weight`` means the head is ``token_embd`` (llama.cpp's reading),
    so the strict inventory does not miss a head; a GGUF with its own head still needs it."""
    from bringup_artifacts import gguf_mixtral, gguf_tiny

    tied = cli.ok("verify", gguf_tiny(tmp_path / "tied"), "--strict")
    assert tied["notes"] == ["llama: 20 operator slots present"], tied["notes"]
    untied = cli.ok("verify", gguf_mixtral(tmp_path / "moe"), "--strict")
    assert any("operator slots present" in n for n in untied["notes"]), untied["notes"]
    cli.ok("push", gguf_tiny(tmp_path / "again"), "acme/g:v1", "--strict")
