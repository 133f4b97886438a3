"""``push --witness FILE``: the producer's rows, checked at push, stored, re-checked at pull and verify."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from quantized import expected_decode, gptq_planes, quantize_minmax
from safetensors.numpy import save_file
from support import Cli

from shardport.provenance import dsse
from shardport.provenance.statement import PAYLOAD_TYPE
from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, manifest_statement
from shardport.registry.trust.tagging import move_tag

PREFIX = "model.layers.0.mlp.down_proj"
WEIGHT = f"{PREFIX}.weight"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "checkpoint_format": "gptq"}


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def checkpoint(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """A GPTQ checkpoint of a random float weight; returns (the float weight, its exact decode)."""
    original = np.random.default_rng(7).standard_normal((64, 128)).astype(np.float32)
    case = quantize_minmax(original, 32)
    planes = gptq_planes(case, PREFIX)
    planes["model.norm.weight"] = np.ones(64, dtype=np.float16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in planes.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "quantization_config": GPTQ}
    (folder / "config.json").write_text(json.dumps(config))
    return original, expected_decode(case["q"], case["zeros"], case["scales"], np.arange(128) // 32)


def witness_file(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


ROWS = np.array([0, 17, 63], dtype=np.int64)


def test_producer_witness_checked_stored_and_rechecked(cli: Cli, tmp_path: Path) -> None:
    original, exact = checkpoint(tmp_path / "q")
    floats = witness_file(
        tmp_path / "w.safetensors", {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": original[ROWS]}
    )
    out = cli.ok("push", tmp_path / "q", "acme/q:v1", "--witness", floats)
    ref = cli.ok("inspect", "acme/q:v1")["manifest"]["producer_witness"]
    assert ref["weights"] == 1 and ref["rows"] == 3 and ref["exact"] is False  # float weights: within bound
    session = Session.open(cli.store)
    assert digest_bytes(session.store.read_blob(ref["digest"])) == ref["digest"]

    dequantized = witness_file(
        tmp_path / "d.safetensors", {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": exact[ROWS]}
    )
    cli.ok("push", tmp_path / "q", "acme/q:v2", "--witness", dequantized)
    assert cli.ok("inspect", "acme/q:v2")["manifest"]["producer_witness"]["exact"] is True

    pulled = cli.ok("pull", "acme/q:v1", tmp_path / "pulled")
    assert pulled["digest"] == out["digest"]
    kept = tmp_path / "pulled" / ".shardport" / "witness.safetensors"
    assert digest_bytes(kept.read_bytes()) == ref["digest"]
    assert cli.ok("verify", tmp_path / "pulled")["ok"]
    kept.write_bytes(kept.read_bytes()[:-4] + b"\0\0\0\0")  # a changed value in the kept copy
    code, report = cli("verify", tmp_path / "pulled")
    assert code == 1 and report["findings"][0]["kind"] == "DigestMismatchError", report


def test_a_witness_that_disagrees_with_the_codes_is_refused_at_push(cli: Cli, tmp_path: Path) -> None:
    original, _ = checkpoint(tmp_path / "q")
    for values in (original[ROWS] * 1.05, original[[1, 18, 62]]):  # scaled; the rows of other rows
        bad = witness_file(tmp_path / "w.safetensors", {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": values})
        code, out = cli("push", tmp_path / "q", "acme/q:v1", "--witness", bad)
        assert code == 5 and out["error"]["type"] == "ReferenceErrorTooLargeError", out  # refused input
        assert WEIGHT in out["error"]["message"] and "producer witness" in out["error"]["message"]
    assert cli.ok("ls") == []  # nothing was tagged


@pytest.mark.parametrize(
    ("tensors", "error", "says"),
    [
        ({"model.layers.9.mlp.up_proj.weight.rows": ROWS}, "WitnessWeightError", "no such weight"),
        ({f"{WEIGHT}.rows": ROWS}, "WitnessWeightError", "absent"),
        (
            {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": np.zeros((3, 64), np.float32)},
            "WitnessShapeError",
            "[3, 128]",
        ),
        (
            {f"{WEIGHT}.rows": ROWS.astype(np.int32), f"{WEIGHT}.values": np.zeros((3, 128), np.float32)},
            "WitnessShapeError",
            "I32",
        ),
        (
            {f"{WEIGHT}.rows": np.array([0, 64, 1]), f"{WEIGHT}.values": np.zeros((3, 128), np.float32)},
            "WitnessRowError",
            "found 64",
        ),
        (
            {f"{WEIGHT}.rows": np.array([5, 5, 1]), f"{WEIGHT}.values": np.zeros((3, 128), np.float32)},
            "WitnessRowError",
            "distinct",
        ),
        (
            {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": np.full((3, 128), np.nan, np.float32)},
            "WitnessValueError",
            "finite",
        ),
    ],
    ids=[
        "unknown-weight",
        "rows-without-values",
        "wrong-shape",
        "wrong-dtype",
        "row-out-of-range",
        "repeated-row",
        "non-finite",
    ],
)
def test_bad_witness_files_are_refused_by_name(
    cli: Cli, tmp_path: Path, tensors: dict[str, np.ndarray], error: str, says: str
) -> None:
    checkpoint(tmp_path / "q")
    bad = witness_file(tmp_path / "w.safetensors", tensors)
    code, out = cli("push", tmp_path / "q", "acme/q:v1", "--witness", bad)
    assert code == 2 and out["error"]["type"] == error, out
    assert says in out["error"]["message"] and "w.safetensors" in out["error"]["message"]
    code, out = cli("push", tmp_path / "q", "acme/q:v1", "--witness", tmp_path / "missing.safetensors")
    assert code == 2 and "cannot read" in out["error"]["message"], out


def test_pull_rechecks_the_signed_producer_witness(cli: Cli, tmp_path: Path) -> None:
    original, _ = checkpoint(tmp_path / "q")
    good = witness_file(
        tmp_path / "w.safetensors", {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": original[ROWS]}
    )
    out = cli.ok("push", tmp_path / "q", "acme/q:v1", "--witness", good)
    session = Session.open(cli.store)
    doc = json.loads(session.store.read_blob(out["digest"]))
    bad = witness_file(
        tmp_path / "b.safetensors", {f"{WEIGHT}.rows": ROWS, f"{WEIGHT}.values": original[ROWS] * 1.05}
    ).read_bytes()
    doc["producer_witness"].update(digest=session.store.put_blob(bad), size=len(bad))  # a producer bug
    forged = Manifest.model_validate(doc)
    digest = session.store.put_blob(forged.to_bytes())
    assert session.key is not None
    env = dsse.sign(PAYLOAD_TYPE, manifest_statement("acme/q", digest).to_bytes(), [session.key])
    attach(session, "acme/q", digest, session.store.put_blob(env.to_bytes()), SIGNATURE_ARTIFACT)
    move_tag(session, "acme/q", "v1", digest)
    code, res = cli("pull", "acme/q:v1", tmp_path / "dest")
    assert code == 1 and res["error"]["type"] == "WitnessMismatchError", res  # the stored bytes lied
    assert not (tmp_path / "dest").exists()
    assert forged.producer_witness is not None
    cli.ok("gc", "--grace-seconds", "0")  # the witness blob a tagged manifest names is kept
    assert session.store.has_blob(forged.producer_witness.digest)
    Path(session.store.path(blob_key(forged.producer_witness.digest))).unlink()
    code, report = cli("fsck")
    assert code != 0 and any("producer witness" in d for d in report["dangling"]), report
