"""Per-rank pulls end to end: push (tile index) → plan → verified range reads → rank-local files.

For a llama-shaped GPTQ checkpoint and a GGUF Q4_1 one, at tp 2, 4 and 8 (3 with aligned splits):
every rank reads at most 1.05 times its assigned bytes, the ranks' slices put back together reproduce every
tensor byte for byte (so the reference decode of every weight exactly), a flipped byte in a tile a
rank reads is caught by that rank, and one in a tile nobody reads is never touched.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from llama_artifacts import cli, gguf_llama, gptq_llama, ok, reassemble
from safetensors import safe_open

from shardport.registry.artifact.manifest import Manifest
from shardport.registry.contracts import CellWitness, decode_weight
from shardport.registry.contracts.model import cell_positions
from shardport.registry.session import Session
from shardport.registry.store.keys import blob_key
from shardport.registry.store.s3 import S3_PROFILE


def pushed(store: str, kind: str, folder: Path) -> tuple[Path, str]:
    """A llama-shaped ``kind`` (gptq, gguf) checkpoint written to ``folder`` and pushed as acme/llama:q4
    with small tiles (so that these small tensors still have several tiles per split)."""
    src = gptq_llama(folder) if kind == "gptq" else gguf_llama(folder)
    ok(store, "keygen")
    digest = ok(store, "push", src, "acme/llama:q4", "--tile-min", "256", "--tile-size", "16384")["digest"]
    return src, str(digest)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gptq", "gguf"])
def test_rank_pulls_local(kind: str, tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src, digest = pushed(store, kind, tmp_path / "ck")
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    for tp in (2, 4, 8, 3):
        outs, checked = [], 0
        for rank in range(tp):
            res = ok(
                store, "pull", "acme/llama:q4", tmp_path / f"tp{tp}", "--tp", str(tp), "--rank", str(rank)
            )
            assert res["digest"] == digest
            if tp != 3:
                assert res["read_amplification"] <= 1.05, (tp, rank, res["read_amplification"])
            assert res["ledger"]["peak_staging_bytes"] <= res["ledger"]["staging_bound_bytes"]
            checked += res["ledger"]["witness_cells_checked"]
            assert res["ledger"]["witness_weights_unchecked"] == 0
            assert res["ledger"]["witness_weights_checked"] > 0
            outs.append(Path(res["out"]))
        reassemble(manifest, src, outs)
        cells = sum(
            len(cell_positions(w.witness)) * w.witness.experts
            for w in manifest.weights or []
            if isinstance(w.witness, CellWitness)
        )
        assert checked >= cells > 0  # every witness cell re-decoded by at least one rank
    # the reassembled bytes are the source bytes, so every weight's reference decode is exact
    weights = manifest.weights or []
    assert any(w.contract.family in ("affine_int", "gguf_block") for w in weights)
    w = next(w for w in weights if w.contract.family != "float")
    entries = {e.name: e for e in manifest.tensors or []}
    planes = {
        p.tensor: np.fromfile(
            src / entries[p.tensor].file,
            dtype=np.uint8,
            count=entries[p.tensor].end - entries[p.tensor].start,
            offset=entries[p.tensor].start,
        )
        for p in w.planes
    }
    assert decode_weight(w, planes).shape == tuple(w.shape.extents)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


@pytest.mark.parametrize("kind", ["gptq", "gguf"])
def test_node_pull_reads_each_byte_once_per_node(kind: str, tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    src, digest = pushed(store, kind, tmp_path / "ck")
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    for tp in (4, 8):
        singles = [
            ok(store, "pull", "acme/llama:q4", tmp_path / f"r{tp}", "--tp", str(tp), "--rank", str(r))
            for r in range(tp)
        ]
        node = ok(store, "pull", "acme/llama:q4", tmp_path / f"n{tp}", "--tp", str(tp), "--ranks", "all")
        assert node["digest"] == digest and node["node_ranks"] == list(range(tp))
        # a rank's column pieces of these small rows are smaller than a page: alone, it makes the device
        # read whole pages that mostly hold other ranks' bytes; the node reads each page once
        assert max(s["ledger"]["page_amplification"] for s in singles) > 1.5
        assert node["read_amplification"] <= 1.05 and node["ledger"]["page_amplification"] <= 1.05
        assert node["requests"] < sum(s["requests"] for s in singles)
        assert node["bytes_assigned"] == sum(s["bytes_assigned"] for s in singles)
        # each single pull planned only its rank, yet all of them and the node agree on the decisions
        assert {s["plan_digest"] for s in singles} == {node["plan_digest"]}
        for single, mine in zip(singles, node["ranks"], strict=True):  # the same files as one by one
            assert mine["bytes_assigned"] == single["bytes_assigned"]
            a, b = _tensors(Path(single["out"])), _tensors(Path(mine["out"]))
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        reassemble(manifest, src, [Path(r["out"]) for r in node["ranks"]])
        ledger = json.loads((tmp_path / f"n{tp}" / f"node-00000-{tp - 1:05d}.ledger.json").read_text())
        assert ledger["node_ranks"] == list(range(tp)) and ledger["bytes_fetched"] == node["bytes_fetched"]
    half = ok(store, "pull", "acme/llama:q4", tmp_path / "half", "--tp", "4", "--ranks", "2-3")
    assert [r["rank"] for r in half["ranks"]] == [2, 3]
    plan_2 = json.loads((tmp_path / "half" / "rank-00002.plan.json").read_text())
    assert plan_2["rank"] == 2 and plan_2["bytes_assigned"] == half["ranks"][0]["bytes_assigned"]
    for bad, why in (
        ("3-1", "runs backwards"),
        ("0,x", "'x' is not a rank"),
        ("1_0", "is not a rank"),
        ("0,1,1", "rank 1 is named twice"),
        ("0-2,2", "rank 2 is named twice"),
        ("7", "outside 0..3"),
        ("0-20000000", "outside 0..3"),
    ):
        code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "bad", "--tp", "4", "--ranks", bad)
        assert code == 2 and why in out["error"]["message"], (bad, out)
    code, out = cli(
        store, "pull", "acme/llama:q4", tmp_path / "bad", "--tp", "4", "--rank", "1", "--ranks", "all"
    )
    assert code == 2 and "not both" in out["error"]["message"], out
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "bad", "--ranks", "all")  # no topology
    assert code == 2 and "--tp" in out["error"]["message"], out
    assert not (tmp_path / "bad").exists()


def test_flipped_tile_detected_untouched_tile_ignored(tmp_path: Path, home: Path) -> None:
    store = str(tmp_path / "store")
    _, digest = pushed(store, "gptq", tmp_path / "ck")
    session = Session.open(store)
    manifest = Manifest.from_bytes(session.store.read_blob(digest))
    entries = {e.name: e for e in manifest.tensors or []}
    blob = blob_key(manifest.files[[f.path for f in manifest.files].index("model.safetensors")].digest)
    # rank 0 of tp 2 reads the first half of q_proj's output rows (a column split of the packed plane)
    q = entries["model.layers.0.self_attn.q_proj.qweight"]
    row_bytes = (q.end - q.start) // q.shape[0]
    inside = q.start + 10 * row_bytes + 16  # column 4 of row 10: rank 0's half
    outside = q.start + 10 * row_bytes + row_bytes - 16  # last columns of row 10: rank 1's half
    raw = bytearray(session.store.read(blob))
    raw[outside] ^= 0x40
    session.store.put(blob, bytes(raw))
    res = ok(store, "pull", "acme/llama:q4", tmp_path / "r0", "--tp", "2", "--rank", "0")
    fetched = res["ledger"]["fetched"]
    assert not any(
        o + k * stride <= outside < o + k * stride + n
        for f, o, n, stride, count in fetched
        if f == "model.safetensors"
        for k in range(count)
    )
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r1", "--tp", "2", "--rank", "1")
    assert code == 1 and out["error"]["type"] == "TileDigestMismatchError", out
    assert "q_proj.qweight" in out["error"]["message"]
    raw[inside] ^= 0x40
    session.store.put(blob, bytes(raw))
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r0b", "--tp", "2", "--rank", "0")
    assert code == 1 and out["error"]["type"] == "TileDigestMismatchError", out
    assert not (tmp_path / "r0b" / "rank-00000-of-00002.safetensors").exists()


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("kind", ["gptq", "gguf"])
def test_rank_pulls_seaweedfs(kind: str, seaweed_store_url: str, tmp_path: Path, home: Path) -> None:
    store = seaweed_store_url
    src, digest = pushed(store, kind, tmp_path / "ck")
    manifest = Manifest.from_bytes(Session.open(store).store.read_blob(digest))
    ref = "acme/llama:q4"
    if kind == "gguf":  # on S3 a column split of row-major GGUF rows is one GET per row: use tiles
        ref = "acme/llama:tiled"
        ok(store, "convert", "acme/llama:q4", ref, "--layout", "tiled")
    for tp in (2, 4, 8):
        outs = []
        for rank in range(tp):
            res = ok(store, "pull", ref, tmp_path / f"tp{tp}", "--tp", str(tp), "--rank", str(rank))
            # GPTQ row-major: a rank's N-split of every [K/8, N] row is read whole, gaps included (S3
            # prices requests: ReadProfile.request_bytes), at most the profile's amplification
            bound = 1.05 if kind == "gguf" else S3_PROFILE.max_amplification + 0.02
            assert res["read_amplification"] <= bound, (tp, rank, res["read_amplification"])
            assert 0 < res["requests"] <= 8 * len(res["ledger"]["tiles"])  # a handful per tensor
            outs.append(Path(res["out"]))
        reassemble(manifest, src, outs)


def test_rank_load_refuses_bytes_contradicting_the_witness(tmp_path: Path, home: Path) -> None:
    from shardport.provenance import dsse
    from shardport.provenance.statement import PAYLOAD_TYPE
    from shardport.registry.trust.signatures import SIGNATURE_ARTIFACT, attach, manifest_statement
    from shardport.registry.trust.tagging import move_tag

    store = str(tmp_path / "store")
    _, digest = pushed(store, "gptq", tmp_path / "ck")
    session = Session.open(store)
    doc = json.loads(session.store.read_blob(digest))
    w = next(w for w in doc["weights"] if w["name"] == "model.layers.0.self_attn.q_proj.weight")
    raw = base64.b64decode(w["witness"]["digests"])
    w["witness"]["digests"] = base64.b64encode(raw[8:] + raw[:8]).decode()  # the witness of other cells
    forged = Manifest.model_validate(doc)
    new = session.store.put_blob(forged.to_bytes())
    assert session.key is not None
    env = dsse.sign(PAYLOAD_TYPE, manifest_statement("acme/llama", new).to_bytes(), [session.key])
    attach(session, "acme/llama", new, session.store.put_blob(env.to_bytes()), SIGNATURE_ARTIFACT)
    move_tag(session, "acme/llama", "q4", new)
    failures = []
    for rank in range(2):
        code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "r", "--tp", "2", "--rank", str(rank))
        if code != 0:
            assert out["error"]["type"] == "WitnessMismatchError", out
            assert not (tmp_path / "r" / f"rank-{rank:05d}-of-00002.safetensors").exists()
            failures.append(rank)
    assert failures == [0, 1]  # every rank holds witness cells of the weight, so each refuses
    # a node pull checks every rank's witnesses before writing any rank's file
    code, out = cli(store, "pull", "acme/llama:q4", tmp_path / "node", "--tp", "2", "--ranks", "all")
    assert code != 0 and out["error"]["type"] == "WitnessMismatchError", out
    assert not list((tmp_path / "node").glob("rank-*"))
