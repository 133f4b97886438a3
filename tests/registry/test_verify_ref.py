"""``registry verify REF`` checks what pull and rank pulls check; ``fsck`` checks every referrer link.

Every tampering that makes a full pull or a rank pull fail must be caught by ``verify REF`` (and the
store-level ones by ``fsck`` too): the table at the end tries each on a fresh store.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_artifacts import cli

from shardport.provenance import dsse
from shardport.registry.artifact.hashing import hex_of
from shardport.registry.artifact.manifest import Manifest, TileIndexRef
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key, referrer_key, tag_key
from shardport.registry.tiles.model import TileIndex
from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, referrers, sign_manifest
from shardport.registry.trust.tagging import move_tag

NAME, TAG = "acme/tiny", "q4"
REF = f"{NAME}:{TAG}"
H, INTER, VOCAB = 128, 256, 64


def tiny_gguf(folder: Path, seed: int = 1) -> Path:
    """A one-layer llama-shaped GGUF with Q4_1 linears (115 kB; 12 weights, 10 of them quantized)."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(1)
    w.add_embedding_length(H)
    w.add_feed_forward_length(INTER)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    q41 = gguf.GGMLQuantizationType.Q4_1

    def add(name: str, shape: tuple[int, int]) -> None:
        w.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), q41), raw_dtype=q41)

    add("token_embd.weight", (VOCAB, H))
    for stem in ("attn_q", "attn_k", "attn_v", "attn_output"):
        add(f"blk.0.{stem}.weight", (H, H))
    add("blk.0.ffn_gate.weight", (INTER, H))
    add("blk.0.ffn_up.weight", (INTER, H))
    add("blk.0.ffn_down.weight", (H, INTER))
    for norm in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{norm}.weight", np.ones(H, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(H, dtype=np.float32))
    add("output.weight", (VOCAB, H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (folder / "README.md").write_text("a tiny test model\n")
    return folder


def ok(store: str, *args: str | Path) -> dict[str, Any]:
    code, out = cli(store, *args)
    assert code == 0, out
    return out


class World:
    """A store with two pushed versions of ``REF`` (small tiles: many per tensor)."""

    def __init__(self, store: str, tmp: Path) -> None:
        self.store, self.tmp = store, tmp
        ok(store, "keygen")
        self.v1 = str(ok(store, "push", tiny_gguf(tmp / "v1", 1), REF, *TILES)["digest"])
        self.v2 = str(ok(store, "push", tiny_gguf(tmp / "v2", 2), REF, *TILES)["digest"])
        self.session = Session.open(store)

    def manifest(self, digest: str | None = None) -> Manifest:
        return Manifest.from_bytes(self.session.store.read_blob(digest or self.v2))

    def index(self, digest: str | None = None) -> TileIndex:
        ref = self.manifest(digest).tile_index
        assert ref is not None
        return TileIndex.from_bytes(self.session.store.read_blob(ref.digest))

    def republish(self, manifest: Manifest) -> str:
        """Store, sign and tag ``manifest`` as the key holder would (what an attacker with the key does)."""
        digest = self.session.store.put_blob(manifest.to_bytes())
        sign_manifest(self.session, NAME, digest)
        move_tag(self.session, NAME, TAG, digest)
        return digest

    def pulls(self) -> dict[str, int]:
        """Exit codes of a full pull and of both ranks of a tp-2 pull (fresh folders; -1: it crashed)."""

        def code(*args: str | Path) -> int:
            try:
                return cli(self.store, "pull", REF, *args)[0]
            except Exception:  # a traceback is a failed pull too (another part of issue 15 removes them)
                return -1

        out = {"full": code(self.tmp / "p-full")}
        for rank in (0, 1):
            out[f"rank{rank}"] = code(self.tmp / f"p-r{rank}", "--tp", "2", "--rank", str(rank))
        return out


TILES = ("--tile-min", "256", "--tile-size", "1024")


@pytest.fixture(params=["local", pytest.param("moto", marks=pytest.mark.s3)])
def world(request: pytest.FixtureRequest, tmp_path: Path, home: Path) -> World:
    store = str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("moto_store_url")
    return World(store, tmp_path)


@pytest.fixture
def local(tmp_path: Path, home: Path) -> World:
    return World(str(tmp_path / "store"), tmp_path)


def flip(data: bytes, at: int | None = None) -> bytes:
    i = len(data) // 2 if at is None else at
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


def kinds(report: dict[str, Any]) -> set[str]:
    return {f["kind"] for f in report["findings"]}


def test_verify_ref_checks_every_weight_and_tile(world: World) -> None:
    report = ok(world.store, "verify", REF)
    pulled = ok(world.store, "pull", REF, world.tmp / "copy")
    assert pulled["digest"] == report["digest"] == world.v2
    assert report["weights_checked"] == ok(world.store, "verify", world.tmp / "copy")["weights_checked"] == 12
    assert report["checked_tiles"] == sum(len(t.hashes) for t in world.index().tensors.values()) > 12
    assert report["checked_files"] == 2 and report["signers"]


def test_resigned_tile_index_with_a_wrong_tile_hash(world: World) -> None:
    """The tile index is signed (through the manifest) but one tile's hash is not the bytes' hash."""
    index = world.index()
    name = "blk.0.ffn_down.weight"
    tiles = index.tensors[name]
    hashes = list(tiles.hashes)
    hashes[1] = ("0" if hashes[1][0] != "0" else "1") + hashes[1][1:]
    bad = index.model_copy(
        update={"tensors": {**index.tensors, name: tiles.model_copy(update={"hashes": tuple(hashes)})}}
    )
    blob = world.session.store.put_blob(bad.to_bytes())
    world.republish(world.manifest().model_copy(update={"tile_index": TileIndexRef(digest=blob)}))
    code, report = cli(world.store, "verify", REF)
    assert code == 1 and kinds(report) == {"TileDigestMismatch"}, report
    (finding,) = report["findings"]
    assert finding["object"] == f"{name} tile (0, 1)" and "model.gguf" in finding["message"]
    assert ok(world.store, "fsck")["ok"]  # every blob hashes to its name: only verify REF can tell
    assert world.pulls()["rank0"] == 1


def test_flipped_hash_inside_the_tile_index_blob(local: World) -> None:
    ref = local.manifest().tile_index
    assert ref is not None
    raw = local.session.store.read(blob_key(ref.digest))
    at = re.search(rb'"([A-Za-z0-9+/]{40,}=*)"', raw).start(1) + 5  # inside a tensor's tile hashes
    local.session.store.put(blob_key(ref.digest), flip(raw, at))
    code, report = cli(local.store, "verify", REF)
    assert code == 1 and report["findings"][0]["object"] == "tile index", report
    assert ref.digest in report["findings"][0]["message"]
    fsck = ok_or_fail(local.store, "fsck")
    assert any(ref.digest in c for c in fsck["corrupt"])


def test_resigned_witness_rows_tampered(local: World) -> None:
    """Two weights' witnesses changed in a re-signed manifest: verify REF names both, pull fails."""
    manifest = local.manifest()
    weights = list(manifest.weights or [])
    chosen = [i for i, w in enumerate(weights) if w.witness is not None][:2]
    for k in chosen:
        witness = weights[k].witness
        assert witness is not None
        digests = bytearray(base64.b64decode(witness.digests))
        digests[-1] ^= 0x01  # the last cell's digest no longer matches the decode
        update = {"digests": base64.b64encode(bytes(digests)).decode()}
        weights[k] = weights[k].model_copy(update={"witness": witness.model_copy(update=update)})
    local.republish(manifest.model_copy(update={"weights": weights}))
    code, report = cli(local.store, "verify", REF)
    assert code == 1 and [f["object"] for f in report["findings"]] == [weights[k].name for k in chosen], (
        report
    )
    assert kinds(report) == {"WitnessMismatchError"}
    assert report["weights_checked"] == len(weights)
    pulled = local.pulls()
    assert pulled["full"] == 1


def test_verify_ref_reports_every_finding(local: World) -> None:
    """A damaged file and a deleted signature link: both reported, not just the first."""
    store = local.session.store
    gguf = next(f for f in local.manifest().files if f.path == "model.gguf")
    store.put(blob_key(gguf.digest), flip(store.read(blob_key(gguf.digest))))
    (sig,) = referrers(local.session, NAME, local.v2, SIGNATURE_ARTIFACT)
    store.delete(referrer_key(NAME, local.v2, sig))
    code, report = cli(local.store, "verify", REF)
    assert code == 1
    assert {"UnsignedError", "DigestMismatch", "TileDigestMismatch"} <= kinds(report), report
    assert any("witnesses not re-decoded" in n for n in report["notes"])


def ok_or_fail(store: str, *args: str) -> dict[str, Any]:
    return cli(store, *args)[1]


# ---- fsck and referrer links ---------------------------------------------------------------------


def test_fsck_flags_deleted_and_damaged_signature_links(local: World) -> None:
    store = local.session.store
    (sig1,) = referrers(local.session, NAME, local.v1, SIGNATURE_ARTIFACT)
    (sig2,) = referrers(local.session, NAME, local.v2, SIGNATURE_ARTIFACT)
    assert ok(local.store, "fsck")["referrers"] == 2
    store.delete(referrer_key(NAME, local.v2, sig2))
    code, report = cli(local.store, "fsck")
    assert code == 1 and len(report["unsigned"]) == 1, report
    assert f"{NAME}:{TAG} version 2" in report["unsigned"][0] and "UnsignedError" in report["unsigned"][0]
    store.put(referrer_key(NAME, local.v2, sig2), b"\x00not json")  # damaged link
    code, report = cli(local.store, "fsck")
    assert code == 1 and report["unsigned"] and "not a JSON document" in report["bad_referrers"][0], report
    # a link naming another blob than its key (the signature of version 1)
    store.put(
        referrer_key(NAME, local.v2, sig2),
        json.dumps({"artifactType": SIGNATURE_ARTIFACT, "digest": sig1}).encode(),
    )
    code, report = cli(local.store, "fsck")
    assert code == 1 and "naming its own blob" in report["bad_referrers"][0], report
    assert cli(local.store, "pull", REF, local.tmp / "d")[1]["error"]["type"] == "UnsignedError"


def test_fsck_checks_what_a_signature_link_points_at(local: World) -> None:
    store = local.session.store
    (sig1,) = referrers(local.session, NAME, local.v1, SIGNATURE_ARTIFACT)
    (sig2,) = referrers(local.session, NAME, local.v2, SIGNATURE_ARTIFACT)
    # version 1's signature attached to version 2's manifest: well formed, but of another manifest
    store.delete(referrer_key(NAME, local.v2, sig2))
    attach(local.session, NAME, local.v2, sig1, SIGNATURE_ARTIFACT)
    code, report = cli(local.store, "fsck")
    assert code == 1 and any(f"does not sign manifest {local.v2}" in b for b in report["bad_referrers"])
    assert report["unsigned"]
    # an altered signature re-hosted under its own digest: the key is known, the signature fails
    store.delete(referrer_key(NAME, local.v2, sig1))
    env = dsse.Envelope.from_bytes(store.read_blob(sig2))
    forged = dsse.Envelope(
        env.payload_type, env.payload, (dsse.Signature(env.signatures[0].keyid, flip(env.signatures[0].sig)),)
    )
    attach(local.session, NAME, local.v2, store.put_blob(forged.to_bytes()), SIGNATURE_ARTIFACT)
    code, report = cli(local.store, "fsck")
    assert code == 1 and any("does not verify" in b for b in report["bad_referrers"]), report
    # evidence of another artifact type is only required to be present and intact
    store.delete(referrer_key(NAME, local.v2, hex_digest(forged.to_bytes())))
    attach(local.session, NAME, local.v2, sig2, SIGNATURE_ARTIFACT)
    attach(local.session, NAME, local.v2, store.put_blob(b"{}"), "application/vnd.example.evidence+json")
    report = ok(local.store, "fsck")
    assert report["referrers"] == 3 and not report["bad_referrers"]


def hex_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---- the table: whatever makes a pull fail, verify REF (and fsck where it is the store) catches ----


def _file(w: World) -> str:
    return next(f.digest for f in w.manifest().files if f.path == "model.gguf")


def _tile_index(w: World) -> str:
    ref = w.manifest().tile_index
    assert ref is not None
    return ref.digest


def _flip_blob(digest: Callable[[World], str]) -> Callable[[World], None]:
    def run(w: World) -> None:
        key = blob_key(digest(w))
        w.session.store.put(key, flip(w.session.store.read(key)))

    return run


def _delete_blob(digest: Callable[[World], str]) -> Callable[[World], None]:
    return lambda w: w.session.store.delete(blob_key(digest(w)))


def _signature(w: World) -> str:
    (sig,) = referrers(w.session, NAME, w.v2, SIGNATURE_ARTIFACT)
    return sig


def _link(w: World) -> str:
    return referrer_key(NAME, w.v2, _signature(w))


def _resigned_index(change: Callable[[TileIndex], TileIndex]) -> Callable[[World], None]:
    def run(w: World) -> None:
        blob = w.session.store.put_blob(change(w.index()).to_bytes())
        w.republish(w.manifest().model_copy(update={"tile_index": TileIndexRef(digest=blob)}))

    return run


def _drop_tensor(index: TileIndex) -> TileIndex:
    return index.model_copy(
        update={"tensors": {k: v for k, v in index.tensors.items() if k != "blk.0.attn_q.weight"}}
    )


def _wrong_hash(index: TileIndex) -> TileIndex:
    tiles = index.tensors["blk.0.attn_q.weight"]
    hashes = ("f" * 64, *tiles.hashes[1:])
    return index.model_copy(
        update={
            "tensors": {**index.tensors, "blk.0.attn_q.weight": tiles.model_copy(update={"hashes": hashes})}
        }
    )


def _other_index(w: World) -> None:  # version 1's tile index under version 2's manifest
    w.republish(w.manifest().model_copy(update={"tile_index": TileIndexRef(digest=_tile_index_of(w, w.v1))}))


def _tile_index_of(w: World, digest: str) -> str:
    ref = w.manifest(digest).tile_index
    assert ref is not None
    return ref.digest


def _missing_index(w: World) -> None:
    w.republish(w.manifest().model_copy(update={"tile_index": TileIndexRef(digest="sha256:" + "ab" * 32)}))


def _witness(w: World) -> None:
    manifest = w.manifest()
    weights = list(manifest.weights or [])
    k = next(i for i, x in enumerate(weights) if x.witness is not None and x.name.endswith("attn_v.weight"))
    witness = weights[k].witness
    assert witness is not None
    digests = bytearray(base64.b64decode(witness.digests))
    digests[0] ^= 0x01  # the first cell's digest no longer matches the decode
    update = {"digests": base64.b64encode(bytes(digests)).decode()}
    weights[k] = weights[k].model_copy(update={"witness": witness.model_copy(update=update)})
    w.republish(manifest.model_copy(update={"weights": weights}))


def _tensor_elsewhere(w: World) -> None:  # the tensor table names a file the manifest does not list
    manifest = w.manifest()
    tensors = [
        t.model_copy(update={"file": "MODEL.gguf"}) if t.name == "blk.0.attn_k.weight" else t
        for t in manifest.tensors or []
    ]
    w.republish(manifest.model_copy(update={"tensors": tensors}))


def _flip_tag_doc(w: World) -> None:
    key = tag_key(NAME, TAG, 2)
    raw = w.session.store.read(key)
    i = raw.index(b'"payload":"') + 40
    w.session.store.put(key, raw[:i] + (b"A" if raw[i : i + 1] != b"A" else b"B") + raw[i + 1 :])


TAMPERINGS: dict[str, tuple[Callable[[World], None], bool]] = {
    # name: (tampering, whether fsck must catch it too: the store itself is damaged)
    "file blob flipped": (_flip_blob(_file), True),
    "file blob deleted": (_delete_blob(_file), True),
    "tile index blob flipped": (_flip_blob(_tile_index), True),
    "tile index blob deleted": (_delete_blob(_tile_index), True),
    "manifest blob flipped": (_flip_blob(lambda w: w.v2), True),
    "signature blob flipped": (_flip_blob(_signature), True),
    "signature link deleted": (lambda w: w.session.store.delete(_link(w)), True),
    "signature link damaged": (lambda w: w.session.store.put(_link(w), b"{]"), True),
    "tag document deleted": (lambda w: w.session.store.delete(tag_key(NAME, TAG, 1)), True),
    "tag document flipped": (_flip_tag_doc, True),
    "re-signed: a tile hash wrong": (_resigned_index(_wrong_hash), False),
    "re-signed: a tensor missing from the tile index": (_resigned_index(_drop_tensor), False),
    "re-signed: another artifact's tile index": (_other_index, False),
    "re-signed: tile index missing": (_missing_index, True),
    "re-signed: a witness cell digest changed": (_witness, False),
    "re-signed: a tensor in a file the manifest lacks": (_tensor_elsewhere, False),
}


@pytest.mark.parametrize("case", list(TAMPERINGS))
def test_whatever_fails_a_pull_fails_verify(case: str, local: World) -> None:
    tamper, store_damaged = TAMPERINGS[case]
    tamper(local)
    fsck_code, fsck = cli(local.store, "fsck")
    code, report = cli(local.store, "verify", REF)
    pulls = local.pulls()
    assert set(pulls.values()) - {0}, (case, pulls)  # the tampering matters to some pull
    assert code == 1 and not report.get("ok", False), (case, report)
    if store_damaged:
        assert fsck_code == 1 and not fsck["ok"], (case, fsck)
    assert hex_of(local.v2)  # the world is intact otherwise


def test_fsck_accepts_a_store_pushed_unsigned_on_purpose(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    ok(store, "push", tiny_gguf(tmp_path / "c"), REF, "--allow-unsigned")
    report = ok(store, "fsck")
    assert report["tags"] == 1 and report["referrers"] == 0 and not report["unsigned"]
    assert ok(store, "verify", REF, "--allow-unsigned")["weights_checked"] == 12


def test_fsck_does_not_read_an_oversized_signature(local: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardport.registry import housekeeping

    monkeypatch.setattr(housekeeping, "MAX_SIGNATURE", 1000)
    attach(local.session, NAME, local.v2, local.session.store.put_blob(b"x" * 1001), SIGNATURE_ARTIFACT)
    code, report = cli(local.store, "fsck")
    assert code == 1 and report["bad_referrers"] == [
        f"{NAME}: attachment {hex_digest(b'x' * 1001)} of {local.v2}: 1001 bytes, too large for a signature"
    ], report


def test_verify_ref_refuses_when_the_temporary_folder_is_too_small(
    local: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import shutil
    from collections import namedtuple

    work = tmp_path / "work"
    work.mkdir()
    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as m:
        m.setenv("TMPDIR", str(work))
        m.setattr("tempfile.tempdir", None)  # re-read TMPDIR
        m.setattr(shutil, "disk_usage", lambda _: usage(10**6, 10**6 - 1000, 1000))
        code, report = cli(local.store, "verify", REF)
    assert code == 2 and report["error"]["type"] == "UsageError", report
    assert str(work) in report["error"]["message"] and "TMPDIR" in report["error"]["message"]
    assert list(work.iterdir()) == []
    assert ok(local.store, "verify", REF)["ok"]


def test_sigterm_removes_the_temporary_copy(local: World, tmp_path: Path) -> None:
    """A verify stopped with SIGTERM while it holds its checked copy leaves no temporary folder."""
    import os
    import signal
    import subprocess
    import time

    from support import REGISTRY

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    proc = subprocess.Popen(
        [REGISTRY, "--store", local.store, "--json", "verify", REF],
        env={**os.environ, "TMPDIR": str(tmp), "SHARDPORT_FAILPOINT": "verify-blobs-fetched:pause"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("shardport-verify-*/*")):  # the copy is being written
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        time.sleep(1.0)  # (a signal during the copy must clean up just the same)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGTERM, err
    assert list(tmp.iterdir()) == [], err.decode()
