"""``registry push`` fills the five manifest layers for every kind: container, quantization, packing,
runtime (expected kernels pinned over the catalogue) and topology; ``inspect`` shows them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bringup_artifacts import Shape, gguf_mixtral, gguf_tiny, quantized_llama
from support import Cli

import shardport
from shardport.deploy.up_evidence import expected_kernel
from shardport.kernels import FallbackPolicy, default_catalog, operator_signature
from shardport.kernels.expectations import DEVICE_CLASSES, dispatched, weight_class, whole_weight
from shardport.provenance.keys import SigningKey
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.push import push
from shardport.registry.session import Session
from shardport.registry.store.protocol import Store
from shardport.registry.trust.policy import TrustPolicy
from shardport.registry.trust.state import TrustState

SMALL = Shape(hidden=128, heads=4, kv_heads=2, inter=256, vocab=97, layers=2)
"""4 heads of 32 over 2 kv heads, groups of 32: tp 1, 2 and 4 place it, tp 3 does not."""


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def _inspect(cli: Cli, folder: Path, ref: str) -> dict[str, Any]:
    cli.ok("push", folder, ref)
    out: dict[str, Any] = cli.ok("inspect", ref)["manifest"]
    return out


def _check_runtime(doc: dict[str, Any]) -> None:
    """The runtime layer names this shardport and its catalogue, and every pin equals L5's recomputation."""
    runtime = doc["runtime"]
    catalog = default_catalog()
    assert runtime["name"] == "shardport" and runtime["tested_version"] == shardport.__version__
    assert runtime["catalogue"] == [f"{k.capability.id}@{k.capability.version}" for k in catalog]
    pins = {(e["weight_class"], e["device"]): e for e in runtime["expected_kernels"]}
    manifest = Manifest.model_validate(doc)
    quantized = [w for w in manifest.weights or () if dispatched(w)]
    assert quantized
    for w in quantized:
        device, _ = DEVICE_CLASSES["cpu/float32"]
        op = operator_signature(whole_weight(w), "float32", "decode", device)
        pin = pins[(weight_class(op), "cpu/float32")]
        assert pin["kernel"] == expected_kernel(op, FallbackPolicy(), []) and pin["activations"] == "float32"
    assert sum(e["weights"] for e in runtime["expected_kernels"]) == len(quantized) * len(DEVICE_CLASSES)


def test_gguf_push_fills_every_layer(cli: Cli, tmp_path: Path) -> None:
    doc = _inspect(cli, gguf_tiny(tmp_path / "g"), "g:v1")
    assert doc["container"] == {"kind": "gguf", "profile_version": 1, "spec_revision": "3", "version": 1}
    q = doc["quantization"]
    assert q["family"] == "gguf" and q["quantization_version"] == 2 and q["config_digest"]
    # 2 layers x (q, k: Q4_0; v: Q8_0; o: Q4_1; gate: Q4_0; up: Q8_0; down: Q4_K | Q6_K), tied Q8_0 embedding
    assert q["tensor_types"] == {"F32": 5, "Q4_0": 6, "Q4_1": 2, "Q4_K": 1, "Q6_K": 1, "Q8_0": 5}
    p = doc["packing"]
    assert p["layout"] == "row_major" and p["layout_version"] == 1 and p["packer"] == "gguf"
    assert p["encoding"] == "gguf:F32,gguf:Q4_0,gguf:Q4_1,gguf:Q4_K,gguf:Q6_K,gguf:Q8_0"
    _check_runtime(doc)
    pins = {(e["weight_class"], e["device"]): e["kernel"] for e in doc["runtime"]["expected_kernels"]}
    assert pins[("gguf:Q4_0", "cpu/bfloat16")] == "cpu.int4pack@1"  # its fast path
    assert pins[("gguf:Q4_K", "cpu/float32")] == "cpu.gguf-direct@1"
    # 6 heads of 32 over 3 kv heads; ffn_down's K=768 is 3 Q4_K blocks: tp 1, 2 (aligned), 3, not 6
    assert doc["topology"] == {"tp": [1, 2, 3], "ep": [1], "pp": [1, 2], "version": 1}


def test_gptq_push_fills_every_layer(cli: Cli, tmp_path: Path) -> None:
    folder = quantized_llama(tmp_path / "q", "gptq", 32, SMALL)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["meta"] = {"quantizer": ["gptqmodel:2.2.0"]}
    (folder / "config.json").write_text(json.dumps(config))
    doc = _inspect(cli, folder, "q:v1")
    assert doc["container"]["kind"] == "safetensors" and doc["container"]["spec_revision"] == "1"
    q = doc["quantization"]
    assert (q["family"], q["producer"], q["producer_version"]) == ("gptq", "gptqmodel", "2.2.0")
    assert q["config_digest"].startswith("sha256:") and "tensor_types" not in q
    p = doc["packing"]
    assert (p["layout"], p["packer"], p["packer_version"]) == ("row_major", "gptqmodel", "2.2.0")
    assert p["encoding"] == "affine:u4:slots32,float:F16"
    _check_runtime(doc)
    assert doc["topology"] == {"tp": [1, 2, 4], "ep": [1], "pp": [1, 2], "version": 1}


def test_compressed_tensors_push_fills_every_layer(cli: Cli, tmp_path: Path) -> None:
    folder = quantized_llama(tmp_path / "ct", "compressed-tensors", 32, SMALL)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["version"] = "0.9.1"
    (folder / "config.json").write_text(json.dumps(config))
    doc = _inspect(cli, folder, "ct:v1")
    q = doc["quantization"]
    assert (q["family"], q["producer"], q["producer_version"]) == (
        "compressed-tensors",
        "compressed-tensors",
        "0.9.1",
    )
    assert doc["packing"]["packer"] == "compressed-tensors" and doc["packing"]["encoding"]
    assert doc["container"]["spec_revision"] == "1"
    _check_runtime(doc)
    assert doc["topology"]["tp"] == [1, 2, 4]


def test_kernels_preferred_steer_the_pins(cli: Cli, tmp_path: Path) -> None:
    """Dispatch tries a preferred kernel first, whatever its path (int4pack is slow in f32): pins follow."""
    folder = gguf_tiny(tmp_path / "g")

    def pins(*flags: str) -> dict[tuple[str, str, str], str | None]:
        out = cli.ok("push", folder, "g:v1", *flags)
        doc = cli.ok("inspect", f"g@{out['digest']}")["manifest"]
        return {
            (e["weight_class"], e["device"], e["activations"]): e["kernel"]
            for e in doc["runtime"]["expected_kernels"]
        }

    assert pins()[("gguf:Q4_0", "cpu/float32", "float32")] == "cpu.gguf-direct@1"
    steered = pins("--kernels-preferred", "cpu.int4pack")
    assert steered[("gguf:Q4_0", "cpu/float32", "float32")] == "cpu.int4pack@1"
    # the tied embedding (the output head) keeps float32 in a bfloat16 run: its own entry
    assert steered[("gguf:Q8_0", "cpu/bfloat16", "float32")] == "cpu.gguf-direct@1"
    assert steered[("gguf:Q8_0", "cpu/bfloat16", "bfloat16")] == "cpu.gguf-direct@1"
    # only the reference is required; its class (full dequant) is forbidden by default: nothing expected
    assert set(pins("--kernels-required", "reference").values()) == {None}


def test_the_same_files_give_the_same_digest_on_two_stores(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path
) -> None:
    folder = gguf_tiny(tmp_path / "g")
    digests = set()
    for store in ("a", "b"):
        c = Cli(capsys, str(tmp_path / store))
        if store == "a":
            c.ok("keygen")
        digests.add(c.ok("push", folder, f"m{store}:v1")["digest"])
    assert len(digests) == 1


def test_the_library_push_fills_what_the_registry_reads_itself(tmp_path: Path) -> None:
    """Without the CLI's ``layers``, push writes container, quantization and packing; not runtime/topology."""
    key = SigningKey.generate()
    session = Session(
        store=Store(str(tmp_path / "store")),
        policy=TrustPolicy().with_key(key.verifying_key(), "t", ("*",)),
        state=TrustState(tmp_path / "state", "test"),
        key=key,
    )
    res = push(session, gguf_tiny(tmp_path / "g"), "g", "v1", kernels_preferred=["cpu.int4pack"])
    m = Manifest.from_bytes(session.store.read_blob(res.digest))
    assert m.container.spec_revision == "3" and m.quantization.family == "gguf"
    assert m.packing.layout == "row_major" and m.packing.encoding
    assert m.runtime.kernels_preferred == ["cpu.int4pack"] and m.runtime.expected_kernels is None
    assert m.runtime.name is None and m.topology is None
    assert b'"expected_kernels"' not in m.to_bytes() and b'"catalogue"' not in m.to_bytes()


def test_a_mixture_of_experts_lists_its_ep_degrees(cli: Cli, tmp_path: Path) -> None:
    """Stacked ``[E, N, K]`` experts: ep 1..E place them (each ep rank owns whole experts); one expert's
    ``[N, K]`` is pinned like any other weight."""
    doc = _inspect(cli, gguf_mixtral(tmp_path / "moe", experts=4), "moe:v1")
    assert doc["topology"]["ep"] == [1, 2, 3, 4] and doc["topology"]["pp"] == [1, 2]
    assert doc["quantization"]["tensor_types"] and doc["container"]["spec_revision"] == "3"
    _check_runtime(doc)
