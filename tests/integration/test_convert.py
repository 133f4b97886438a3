"""``registry convert --layout tiled``: validated, signed, and on S3 a few requests per tensor at no
read amplification (row-major column pieces cost a request per row, or with requests priced, their
gaps read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_artifacts import cli, gptq_llama, ok, reassemble
from safetensors.numpy import load_file

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key

TILES = ("--tile-min", "256", "--tile-size", "16384")
WEIGHT = "model.layers.1.mlp.down_proj.weight"


def _push_and_convert(store: str, tmp_path: Path) -> tuple[Path, str, str]:
    src = gptq_llama(tmp_path / "ck")
    ok(store, "keygen")
    source = ok(store, "push", src, "acme/llama:q4", *TILES)["digest"]
    converted = ok(store, "convert", "acme/llama:q4", "acme/llama:q4-tiled", "--layout", "tiled")
    assert converted["digest"] != source and converted["version"] == 1
    return src, source, converted["digest"]


def test_convert_local(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src, source, _ = _push_and_convert(store, tmp_path)
    assert not list(Session.open(store).store.walk("uploads"))  # tiled files moved in, work folder removed
    info = ok(store, "inspect", "acme/llama:q4-tiled")["manifest"]
    assert info["container"]["kind"] == "shardport-tiled"
    assert info["provenance"]["source_manifest"] == source
    assert {t["layout"] for t in info["tensors"]} == {"shardport-tiled"}
    # every layer filled: the tiled layout, the weights' encoding, the source's runtime and topology
    assert info["container"]["spec_revision"] == "1"
    assert info["packing"]["layout"] == "shardport-tiled" and info["packing"]["packer"] == "shardport.convert"
    packed = ok(store, "inspect", "acme/llama:q4")["manifest"]["packing"]
    assert info["packing"]["encoding"] == packed["encoding"] and packed["layout"] == "row_major"
    assert info["runtime"]["expected_kernels"] and info["topology"]["tp"]
    # a full pull re-checks every witness on the de-tiled planes
    ok(store, "pull", "acme/llama:q4-tiled", tmp_path / "full")
    assert ok(store, "verify", tmp_path / "full")["weights_checked"] > 0
    for ref, out in (("acme/llama:q4", "a"), ("acme/llama:q4-tiled", "b")):
        ok(store, "decode", ref, WEIGHT, "--out", tmp_path / f"{out}.safetensors")
    a, b = (load_file(str(tmp_path / f"{x}.safetensors"))[WEIGHT] for x in "ab")
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    source_manifest = Manifest.from_bytes(Session.open(store).store.read_blob(source))
    for tp in (2, 4):
        outs = [
            Path(
                ok(
                    store,
                    "pull",
                    "acme/llama:q4-tiled",
                    tmp_path / f"t{tp}",
                    "--tp",
                    str(tp),
                    "--rank",
                    str(r),
                )["out"]
            )
            for r in range(tp)
        ]
        reassemble(source_manifest, src, outs)  # rank slices of the tiled artifact = the source's bytes
    assert ok(store, "fsck")["ok"]


@pytest.mark.slow
@pytest.mark.s3
def test_convert_refuses_a_damaged_source_blob_and_publishes_nothing(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src = gptq_llama(tmp_path / "ck")
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", *TILES)["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    f = next(f for f in manifest.files if f.path.endswith(".safetensors"))
    blob = Path(Session.open(store).store.path(blob_key(f.digest)))
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[9] ^= 0xFF  # inside the header: no tile covers it, only the file digest does
    blob.write_bytes(bytes(data))
    code, out = cli(store, "convert", "acme/llama:q4", "acme/llama:q4-tiled", "--layout", "tiled")
    assert code != 0 and out["error"]["type"] == "DigestMismatchError"
    assert f.path in out["error"]["message"] and f.digest in out["error"]["message"]
    assert cli(store, "inspect", "acme/llama:q4-tiled")[0] != 0  # nothing was published


def _blob_of(store: str, digest: str, suffix: str) -> tuple[str, Path]:
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    f = next(f for f in manifest.files if f.path.endswith(suffix))
    blob = Path(Session.open(store).store.path(blob_key(f.digest)))
    blob.chmod(0o644)
    return f.path, blob


def test_convert_refuses_a_resized_source_blob_before_reading_it(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    digest = ok(store, "push", gptq_llama(tmp_path / "ck"), "acme/llama:q4", *TILES)["digest"]
    path, blob = _blob_of(store, digest, "config.json")
    size = blob.stat().st_size
    with open(blob, "r+b") as fh:  # a swapped-in blob of 256 MiB (sparse): refused by its size alone
        fh.truncate(256 << 20)
    code, out = cli(store, "convert", "acme/llama:q4", "acme/llama:q4-tiled", "--layout", "tiled")
    assert code != 0 and out["error"]["type"] == "DigestMismatchError"
    assert path in out["error"]["message"] and f"the manifest {size}" in out["error"]["message"]
    assert cli(store, "inspect", "acme/llama:q4-tiled")[0] != 0


def test_convert_names_a_damaged_source_before_a_later_missing_blob(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "keygen")
    digest = ok(store, "push", gptq_llama(tmp_path / "ck"), "acme/llama:q4", *TILES)["digest"]
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    first, last = manifest.files[0], manifest.files[-1]
    _, damaged = _blob_of(store, digest, first.path)
    data = bytearray(damaged.read_bytes())
    data[0] ^= 0xFF
    damaged.write_bytes(bytes(data))
    _blob_of(store, digest, last.path)[1].unlink()  # a later file is missing altogether
    code, out = cli(store, "convert", "acme/llama:q4", "acme/llama:q4-tiled", "--layout", "tiled")
    assert code != 0 and out["error"]["type"] == "DigestMismatchError"
    assert first.path in out["error"]["message"]


def test_convert_cuts_requests_on_seaweedfs(seaweed_store_url: str, tmp_path: Path, home: Path) -> None:
    store = seaweed_store_url
    src, source, _ = _push_and_convert(store, tmp_path)
    source_manifest = Manifest.from_bytes(Session.open(store).store.read_blob(source))
    outs = []
    for rank in range(4):
        row_major = ok(store, "pull", "acme/llama:q4", tmp_path / "rm", "--tp", "4", "--rank", str(rank))
        tiled = ok(store, "pull", "acme/llama:q4-tiled", tmp_path / "tl", "--tp", "4", "--rank", str(rank))
        tensors = len(tiled["ledger"]["tiles"])
        assert tiled["requests"] <= 4 * tensors, (tiled["requests"], tensors)
        # row-major: the N-split [K/8, N] rows are read whole (requests priced on S3), gaps and all
        assert tiled["read_amplification"] <= 1.05 < row_major["read_amplification"], (
            tiled["read_amplification"],
            row_major["read_amplification"],
        )
        outs.append(Path(tiled["out"]))
    reassemble(source_manifest, src, outs)
