"""Every GGUF type gguf.quants dequantizes through the registry: push, pull, rank pulls, decode, verify.

One 2-layer llama GGUF holds a tensor of each newer type (:data:`gguf_artifacts.MIXED_TYPES`: Q2_K,
Q3_K, TQ1_0/TQ2_0, MXFP4, NVFP4, IQ4_NL/IQ4_XS and the IQ grid types), so one cycle covers them all.
The GGUF header digest is recorded at push and checked by verify; a tampered header is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf_artifacts import MIXED_TYPES, mixed_gguf
from llama_artifacts import reassemble
from safetensors import safe_open
from safetensors.numpy import load_file
from support import Cli

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.formats import parse_gguf
from shardport.registry.session import Session
from shardport.registry.trust.signatures import sign_manifest
from shardport.registry.trust.tagging import move_tag

REF = "acme/mixed:v1"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


def _manifest(cli: Cli, tmp_path: Path) -> Manifest:
    session = Session.open(str(tmp_path / "store"))
    digest = cli.ok("inspect", REF)["digest"]
    return Manifest.from_bytes(session.store.read_blob(digest))


def _rank_slices(out: Path) -> dict[str, list[list[int]]]:
    with safe_open(str(out), "numpy") as f:
        meta = f.metadata()
        return {name: json.loads(meta[f"shardport.slice.{name}"])["index"] for name in f.keys()}


@pytest.mark.slow
def test_every_new_type_round_trips(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    expected = mixed_gguf(src)
    cli.ok("push", src, REF, "--tile-min", "256", "--tile-size", "8192")
    manifest = _manifest(cli, tmp_path)
    weights = {w.name: w for w in manifest.weights or []}
    for stem, ggml_type in MIXED_TYPES.items():
        w = weights[f"{stem}.weight"]
        assert w.contract.family == "gguf_block" and w.contract.ggml_type == ggml_type
        assert w.witness is not None  # the decode witness, as for every quantized GGUF weight
    # the header digest: bytes [0, kv_end) of the file, through the tokenizer
    (entry,) = [f for f in manifest.files if f.path == "model.gguf"]
    header = parse_gguf(src / "model.gguf")
    raw = (src / "model.gguf").read_bytes()
    assert entry.gguf_header is not None and entry.gguf_header.end == header.kv_end
    assert entry.gguf_header.digest == digest_bytes(raw[: header.kv_end])
    assert b"tok63" in raw[: header.kv_end]  # the tokenizer is inside the digested range

    # decode: bit-exact with gguf.quants.dequantize
    for name, values in expected.items():
        out = tmp_path / "d.safetensors"
        cli.ok("decode", REF, name, "--out", out)
        got = load_file(str(out))[name]
        assert np.array_equal(got.view(np.uint32), values.reshape(got.shape).view(np.uint32)), name

    cli.ok("pull", REF, tmp_path / "full")
    report = cli.ok("verify", tmp_path / "full")
    assert report["weights_checked"] == len(weights)
    assert cli.ok("verify", REF)["ok"]

    outs, checked = [], 0
    for rank in (0, 1):
        res = cli.ok("pull", REF, tmp_path / f"r{rank}", "--tp", "2", "--rank", str(rank))
        out = Path(res["out"]) if "out" in res else next((tmp_path / f"r{rank}").glob("*.safetensors"))
        outs.append(out)
        for piece, index in _rank_slices(out).items():
            tensor = piece.split("@")[0]
            ggml_type = MIXED_TYPES.get(tensor.removesuffix(".weight"))
            if ggml_type is None or len(index) < 2:
                continue
            block = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]][0]
            c0, c1 = index[-1]
            assert c0 % block == 0 and c1 % block == 0, (piece, index, block)  # blocks never cut
            checked += 1
    assert checked >= len(MIXED_TYPES)
    split_k = {p for out in outs for p, ix in _rank_slices(out).items() if ix[-1] != [0, ix[-1][1]]}
    assert any("attn_output" in p for p in split_k) and any("ffn_down" in p for p in split_k)
    reassemble(manifest, src, outs)  # the ranks' pieces put back are the source bytes


def test_tampered_header_is_refused_by_verify(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    mixed_gguf(src)
    cli.ok("push", src, REF)
    cli.ok("pull", REF, tmp_path / "p")
    path = tmp_path / "p" / "model.gguf"
    raw = bytearray(path.read_bytes())
    at = raw.index(b"tok7")
    raw[at : at + 4] = b"tik7"  # one tokenizer entry changed, same length: the header still parses
    path.chmod(0o644)
    path.write_bytes(bytes(raw))
    code, report = cli("verify", tmp_path / "p")
    assert code != 0
    kinds = {f["kind"]: f for f in report["findings"]}
    assert "HeaderDigestMismatchError" in kinds, report
    message = kinds["HeaderDigestMismatchError"]["message"]
    assert "model.gguf" in message and "expected sha256" in message


def test_a_manifest_whose_header_digest_lies_is_refused(cli: Cli, tmp_path: Path) -> None:
    """The files are intact; the signed manifest's header digest is not theirs: verify REF refuses."""
    mixed_gguf(tmp_path / "src")
    cli.ok("push", tmp_path / "src", REF)
    manifest = _manifest(cli, tmp_path)
    files = []
    for f in manifest.files:
        if f.gguf_header is not None:
            forged = f.gguf_header.model_copy(update={"digest": digest_bytes(b"another header")})
            f = f.model_copy(update={"gguf_header": forged})
        files.append(f)
    session = Session.open(str(tmp_path / "store"))
    digest = session.store.put_blob(manifest.model_copy(update={"files": files}).to_bytes())
    sign_manifest(session, "acme/mixed", digest)
    move_tag(session, "acme/mixed", "v1", digest)
    code, report = cli("verify", REF)
    assert code != 0
    assert [f["kind"] for f in report["findings"]] == ["HeaderDigestMismatchError"], report


def test_push_refuses_an_old_quantization_version(cli: Cli, tmp_path: Path) -> None:
    mixed_gguf(tmp_path / "old", quantization_version=1)
    code, out = cli("push", tmp_path / "old", REF)
    assert code == 5 and out["error"]["type"] == "QuantizationVersionError", out
    message = out["error"]["message"]
    assert "model.gguf" in message and "general.quantization_version" in message and "UINT32 1" in message
    assert not cli.ok("ls")  # nothing was stored
