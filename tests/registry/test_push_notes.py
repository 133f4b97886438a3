"""Checks of fields no loader reads are notes: push succeeds and records them, --strict refuses.

One checkpoint per moved gate (README "Checks noted, not refused"), each pushed through the CLI:
without --strict the push succeeds and the note is in ``inspect --json``; with --strict it is refused
with the gate's own error and that error's exit code.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import Cli

from shardport.registry.contracts import errors as CE
from shardport.registry.formats import errors as E

SHARDS = {
    "model-00001-of-00002.safetensors": {"embed.weight": np.ones((4, 8), np.float16)},
    "model-00002-of-00002.safetensors": {"lm_head.weight": np.full((4, 8), 2, np.float16)},
}
TENSOR_BYTES = sum(a.nbytes for shard in SHARDS.values() for a in shard.values())


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def sharded(folder: Path, metadata: dict[str, Any]) -> Path:
    """Two shards and an index whose ``metadata`` is given (the weight map is right)."""
    folder.mkdir(parents=True)
    for file, tensors in SHARDS.items():
        save_file(tensors, str(folder / file))
    weight_map = {t: f for f, ts in SHARDS.items() for t in ts}
    index = {"metadata": metadata, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def file_sizes_as_total(folder: Path) -> Path:
    """What one producer writes: ``total_size`` = the sum of the shard files' sizes (headers included)."""
    sharded(folder, {})
    total = sum((folder / f).stat().st_size for f in SHARDS)
    assert total != TENSOR_BYTES
    (folder / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": total}, "weight_map": {t: f for f, ts in SHARDS.items() for t in ts}}
        )
    )
    return folder


def unknown_entry_field(folder: Path) -> Path:
    """A safetensors tensor entry with a field beside dtype/shape/data_offsets (safetensors accepts it)."""
    folder.mkdir(parents=True)
    header = {"w": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32], "quant_hint": "none"}}
    raw = json.dumps(header).encode()
    data = np.arange(8, dtype="<f4").tobytes()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return folder


def non_utf8_gguf_value(folder: Path) -> Path:
    """A GGUF whose informative ``general.name`` is not UTF-8 (llama.cpp keeps it as bytes)."""
    import gguf
    from gguf.quants import quantize

    folder.mkdir(parents=True)
    path = folder / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("NAMENAME")
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    writer.add_tensor(
        "blk.0.attn_q.weight",
        quantize(w, gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    raw = path.read_bytes()
    assert raw.count(b"NAMENAME") == 1
    path.write_bytes(raw.replace(b"NAMENAME", b"NAME\xffAME"))
    return folder


def extra_operator_slot(folder: Path) -> Path:
    """A llama checkpoint with a tensor our llama inventory rule does not know."""
    h, inter, vocab = 8, 16, 12
    rng = np.random.default_rng(3)
    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, h)),
        "model.norm.weight": np.ones(h),
        "lm_head.weight": rng.standard_normal((vocab, h)),
        "model.layers.0.mystery.weight": np.ones((2, 2)),
    }
    p = "model.layers.0."
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
    folder.mkdir(parents=True)
    save_file(
        {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in t.items()},
        str(folder / "model.safetensors"),
    )
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": h}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


Case = tuple[Callable[[Path], Path], type[Exception], str | None, str]
CASES: dict[str, Case] = {
    "total-size-is-file-sizes": (
        file_sizes_as_total,
        E.TotalSizeMismatchError,
        "model.safetensors.index.json",
        "metadata.total_size",
    ),
    "total-size-not-a-number": (
        lambda f: sharded(f, {"total_size": "12 GB"}),
        E.ShardIndexError,
        "model.safetensors.index.json",
        "metadata.total_size",
    ),
    "total-parameters-negative": (
        lambda f: sharded(f, {"total_size": TENSOR_BYTES, "total_parameters": -1}),
        E.ShardIndexError,
        "model.safetensors.index.json",
        "metadata.total_parameters",
    ),
    "unknown-tensor-entry-field": (
        unknown_entry_field,
        E.TensorEntryError,
        "model.safetensors",
        "entry fields",
    ),
    "non-utf8-gguf-kv-value": (
        non_utf8_gguf_value,
        E.HeaderEncodingError,
        "model.gguf",
        "KV 'general.name' value",
    ),
    "unexpected-operator-slot": (extra_operator_slot, CE.InventoryMismatchError, None, "inventory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_policing_gate_notes_by_default_and_refuses_under_strict(cli: Cli, tmp_path: Path, case: str) -> None:
    make, error, file, field = CASES[case]
    folder = make(tmp_path / "ckpt")

    code, out = cli("push", folder, "acme/m:strict", "--strict")
    assert code == error.exit_code and out["error"]["exit_code"] == code, out  # type: ignore[attr-defined]
    assert out["error"]["type"] == error.__name__, out
    assert "check_total_size" not in out["error"]["message"]  # a CLI message names no Python argument
    assert cli("inspect", "acme/m:strict")[0] == 3  # nothing was published

    pushed = cli.ok("push", folder, "acme/m:v1")
    graph = {"GraphContractError", "UnsupportedArchitectureError", "UnsupportedOperatorError"}
    # the tiny configs here state too little for a graph contract: that note is not this test's
    [note] = [n for n in cli.ok("inspect", "acme/m:v1")["manifest"]["notes"] if n["code"] not in graph]
    assert (note["code"], note["file"], note["field"]) == (error.__name__, file, field)
    assert note["message"] in pushed["notes"]
    assert str(tmp_path) not in json.dumps(note)  # relative to the checkpoint: the digest names content

    pulled = cli.ok("pull", "acme/m:v1", tmp_path / "dest")
    assert pulled["digest"] == pushed["digest"]
    assert cli.ok("verify", "acme/m:v1")["ok"]


def test_total_size_note_says_what_to_do_without_naming_a_python_argument(cli: Cli, tmp_path: Path) -> None:
    folder = file_sizes_as_total(tmp_path / "ckpt")
    code, out = cli("push", folder, "acme/m:v1", "--strict")
    message = out["error"]["message"]
    assert code == E.TotalSizeMismatchError.exit_code
    assert f"expected {TENSOR_BYTES} (the sum of the tensors' data bytes)" in message
    assert "--strict" in message and "check_total_size" not in message and "=False" not in message
    report = cli.ok("verify", folder)  # verify PATH notes it too, and passes
    assert any("metadata.total_size" in n for n in report["notes"])
    code, report = cli("verify", folder, "--strict")
    assert (
        code == E.TotalSizeMismatchError.exit_code
        and report["findings"][0]["kind"] == "TotalSizeMismatchError"
    )


def test_consumer_protecting_gates_still_refuse_without_strict(cli: Cli, tmp_path: Path) -> None:
    """A tensor the index maps to the wrong shard, and a missing tensor field, refuse by default."""
    wrong = sharded(tmp_path / "wrong", {})
    index = json.loads((wrong / "model.safetensors.index.json").read_text())
    index["weight_map"]["embed.weight"] = "model-00002-of-00002.safetensors"
    (wrong / "model.safetensors.index.json").write_text(json.dumps(index))
    code, out = cli("push", wrong, "acme/m:v1")
    assert code == E.ShardMembershipError.exit_code and out["error"]["type"] == "ShardMembershipError"

    missing = tmp_path / "missing"
    missing.mkdir()
    raw = json.dumps({"w": {"dtype": "F32", "data_offsets": [0, 4], "quant_hint": 1}}).encode()
    (missing / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    code, out = cli("push", missing, "acme/m:v2")
    assert code == E.TensorEntryError.exit_code and out["error"]["type"] == "TensorEntryError"


def test_gate_remedies_name_no_python_argument(tmp_path: Path) -> None:
    """Container errors reach CLI users: their remedies name no Python class, argument or limit field."""
    import re

    from shardport.registry.formats import (
        BytesSource,
        GGUFLimits,
        SafetensorsLimits,
        parse_gguf_source,
        parse_safetensors_source,
        validate_sharded_checkpoint,
    )

    folder = non_utf8_gguf_value(tmp_path / "g")
    gguf_bytes = BytesSource((folder / "model.gguf").read_bytes(), "model.gguf")
    st = unknown_entry_field(tmp_path / "s") / "model.safetensors"
    index = file_sizes_as_total(tmp_path / "i") / "model.safetensors.index.json"
    errors: list[Exception] = []
    for call in (
        lambda: parse_safetensors_source(BytesSource(st.read_bytes()), SafetensorsLimits(max_header_bytes=8)),
        lambda: parse_gguf_source(gguf_bytes, GGUFLimits(max_header_bytes=64)),
        lambda: parse_gguf_source(gguf_bytes, GGUFLimits(max_tensor_count=0)),
        lambda: validate_sharded_checkpoint(index, max_index_bytes=4),
        lambda: validate_sharded_checkpoint(index),
    ):
        with pytest.raises(E.ContainerError) as info:
            call()
        errors.append(info.value)
    for exc in errors:
        assert not re.search(r"\w+Limits|\w+=\w+|max_\w+|check_\w+", str(exc)), str(exc)


def test_many_notes_of_one_kind_keep_the_manifest_small(cli: Cli, tmp_path: Path) -> None:
    """20 tensors with an unknown field, in a shard the index gate parses too: 8 notes and a count."""
    folder = tmp_path / "many"
    folder.mkdir()
    header = {
        f"t{i:02d}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4], "x": i}
        for i in range(20)
    }
    raw = json.dumps(header).encode()
    shard = "model-00001-of-00001.safetensors"
    (folder / shard).write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(80))
    index = {"metadata": {"total_size": 80}, "weight_map": {name: shard for name in header}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    cli.ok("push", folder, "acme/many:v1")
    notes = cli.ok("inspect", "acme/many:v1")["manifest"]["notes"]
    assert [n["tensor"] for n in notes[:-1]] == [f"t{i:02d}" for i in range(8)]
    assert (notes[-1]["code"], notes[-1]["file"], notes[-1]["found"]) == (
        "TensorEntryError",
        shard,
        "12 more",
    )
